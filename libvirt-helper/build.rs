// Links the system's libvirt (libvirt-dev at build time, libvirt0 at run
// time); its pkg-config file names the library directory.
fn main() {
    println!("cargo:rustc-link-lib=dylib=virt");
    if let Ok(out) = std::process::Command::new("pkg-config")
        .args(["--libs-only-L", "libvirt"])
        .output()
    {
        for dir in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Some(dir) = dir.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
