//! The packaging: the platforms the image builds for.

use std::fs;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn root() -> &'static Path {
    Path::new(ROOT)
}

/// The Makefile's docker-buildx builds each platform natively (see the Dockerfile), so every
/// platform in PLATFORMS must be an architecture the Dockerfile accepts and names a C compiler
/// for (the cc crate compiles ring's C and assembly with it).
#[test]
fn every_platform_docker_buildx_builds_is_one_the_dockerfile_builds() {
    let makefile = fs::read_to_string(root().join("Makefile")).unwrap();
    let platforms = makefile
        .lines()
        .find_map(|l| l.strip_prefix("PLATFORMS ?="))
        .expect("PLATFORMS ?= in the Makefile")
        .trim()
        .split(',')
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(platforms.len() >= 2, "PLATFORMS = {platforms:?}");
    let dockerfile = fs::read_to_string(root().join("Dockerfile")).unwrap();
    // The builder stage's architecture check: `x86_64|aarch64) ;;`.
    let accepted = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_suffix(") ;; \\"))
        .expect("the Dockerfile's architecture check")
        .split('|')
        .collect::<Vec<_>>();
    for platform in &platforms {
        // `uname -m` in a container of this platform (natively or under QEMU).
        let arch = match platform.as_str() {
            "linux/amd64" => "x86_64",
            "linux/arm64" => "aarch64",
            other => panic!("PLATFORMS has {other}, which the Dockerfile does not build"),
        };
        assert!(
            accepted.contains(&arch),
            "the Dockerfile refuses {arch}: {accepted:?}"
        );
        let cc = format!("CC_{arch}_unknown_linux_musl=musl-gcc");
        assert!(dockerfile.contains(&cc), "the Dockerfile does not set {cc}");
    }
}
