//! systemd.generator(7) entry point; the logic is `berth::generator`, so
//! tests and `berth check` share it.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(berth::generator::run(&args));
}
