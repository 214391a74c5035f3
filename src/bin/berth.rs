fn main() {
    std::process::exit(berth::cli::main());
}
