//! Test support shared across modules: a temporary root with a config,
//! to run the helpers and the supervisor against [`crate::systemd::fake`],
//! and a real etcd for the cluster agent's phases.

#[cfg(feature = "cluster")]
pub(crate) mod etcd;
#[cfg(feature = "cluster")]
pub(crate) mod relay;

use crate::config::Loaded;
use crate::paths::Root;

/// A root in a temporary directory with `host` as berth.toml and one file
/// per workload (name, body); a body that names no unit or domain gets a
/// command. The config must load clean.
pub(crate) fn temp_root(host: &str, workloads: &[(&str, &str)]) -> (tempfile::TempDir, Root, Loaded) {
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc/berth/workloads");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(dir.path().join("etc/berth/berth.toml"), host).unwrap();
    for (name, body) in workloads {
        // A body that names its unit or domain runs no command.
        let exec = if body.starts_with("unit = ") || body.starts_with("libvirt = ") {
            ""
        } else {
            "exec = [\"/bin/x\"]\n"
        };
        std::fs::write(etc.join(format!("{name}.toml")), format!("{exec}{body}")).unwrap();
    }
    let root = Root::new(dir.path());
    let loaded = crate::config::load(&root);
    assert!(loaded.is_clean(), "{:?}", loaded.errors);
    (dir, root, loaded)
}
