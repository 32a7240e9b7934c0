//! The simulated container runtime: what a container does is decided by its image reference,
//! so the image names a test uses mean the same on a real cluster; plus the kubelet's back-off
//! arithmetic and the ids and messages a v1.28 kubelet with containerd writes.

use std::hash::{Hash, Hasher};
use std::time::Duration;

/// How a container behaves, from its image reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Runs until stopped; exits 0 shortly after SIGTERM (`registry.k8s.io/pause:3.9`, nginx...).
    RunsUntilStopped,
    /// The image cannot be pulled: ErrImagePull, then ImagePullBackOff (`...does-not-exist...`,
    /// or a version of nginx, busybox or pause that was never published, such as `nginx:9.99`).
    PullFails,
    /// Exits 0 as soon as it starts: busybox's default command is `sh`, which ends at once
    /// without a terminal, so with `restartPolicy: Always` it crash-loops (`busybox`, any
    /// registry or tag).
    ExitsAtOnce,
    /// Runs until SIGKILL at the end of the grace period, exit code 137 (`...ignore-sigterm...`).
    IgnoresSigterm,
    /// Not an image reference at all (`NGINX:::Latest@@`): the kubelet refuses it before any
    /// pull, waiting InvalidImageName, for as long as the pod lives.
    InvalidName,
}

/// Repositories whose published versions the runtime knows, with the newest major version each
/// has: a version tag past it (`nginx:2`, `nginx:9.99`) is one the registry does not have, so
/// on a real node its pull fails with NotFound. Other tags (`latest`, `1.27`, `1.36-musl`) and
/// other repositories, whose versions it cannot know, run.
const PUBLISHED_MAJORS: [(&str, u64); 3] = [
    ("docker.io/library/nginx", 1),
    ("docker.io/library/busybox", 1),
    ("registry.k8s.io/pause", 3),
];

impl Behaviour {
    /// The behaviour of `image`. A reference naming `does-not-exist` anywhere, or a version of a
    /// repository in [`PUBLISHED_MAJORS`] that was never published, fails to pull; one naming
    /// `ignore-sigterm` ignores SIGTERM; one whose repository's last path segment is `busybox`
    /// exits at once; everything else runs until stopped.
    pub fn of(image: &str) -> Behaviour {
        if reference_error(image).is_some() {
            return Behaviour::InvalidName;
        }
        if image.contains("does-not-exist") || !published(image) {
            return Behaviour::PullFails;
        }
        if image.contains("ignore-sigterm") {
            return Behaviour::IgnoresSigterm;
        }
        if repository(image).rsplit('/').next() == Some("busybox") {
            return Behaviour::ExitsAtOnce;
        }
        Behaviour::RunsUntilStopped
    }
}

/// Whether a registry could have `image`: false only for a version tag of a repository in
/// [`PUBLISHED_MAJORS`] whose major version is past the newest published one.
fn published(image: &str) -> bool {
    if image.contains('@') {
        // A digest names content, not a version; nothing to say about it.
        return true;
    }
    let full = normalize(image);
    let repo = repository(&full);
    let Some(&(_, newest)) = PUBLISHED_MAJORS.iter().find(|(r, _)| *r == repo) else {
        return true;
    };
    let tag = &full[repo.len() + 1..];
    let major: String = tag.chars().take_while(char::is_ascii_digit).collect();
    major.parse::<u64>().map_or(true, |m| m <= newest)
}

/// The repository part of an image reference: without tag and digest
/// (`registry:5000/team/app:1.0@sha256:...` → `registry:5000/team/app`).
fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last_slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    match no_digest[last_slash..].rfind(':') {
        Some(colon) => &no_digest[..last_slash + colon],
        None => no_digest,
    }
}

/// The fully qualified reference containerd resolves `image` to: `docker.io/library/` for
/// short names, `:latest` when there is neither tag nor digest (`nginx` →
/// `docker.io/library/nginx:latest`), as the kubelet reports it in `containerStatuses.image`.
pub fn normalize(image: &str) -> String {
    let first = image.split('/').next().unwrap_or("");
    let has_registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_registry {
        image.to_string()
    } else if image.contains('/') {
        format!("docker.io/{image}")
    } else {
        format!("docker.io/library/{image}")
    };
    if !image.contains('@') && repository(&full).len() == full.len() {
        full.push_str(":latest");
    }
    full
}

/// 64 hex digits derived from `seed`: the shape of a sha256 digest or a containerd id, stable
/// for the same seed (image ids) or unique when the seed is (container ids).
fn digest_hex(seed: &str) -> String {
    let mut out = String::with_capacity(64);
    for round in 0u8..4 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (round, seed).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// `imageID` of a started container: `repository@sha256:...`, as containerd reports it.
pub fn image_id(image: &str) -> String {
    let full = normalize(image);
    format!("{}@sha256:{}", repository(&full), digest_hex(&full))
}

/// A fresh `containerID` (`containerd://` and 64 hex digits).
pub fn container_id(pod_uid: &str, container: &str, restart: u32) -> String {
    let mut nonce = [0u8; 8];
    crate::util::random_bytes(&mut nonce);
    format!(
        "containerd://{}",
        digest_hex(&format!(
            "{pod_uid}/{container}/{restart}/{}",
            crate::util::hex(&nonce)
        ))
    )
}

/// The waiting message of ErrImagePull: the CRI error text containerd 1.7 returns for a
/// reference the registry does not have, which the v1.28 kubelet passes on as it is.
pub fn pull_error(image: &str) -> String {
    let full = normalize(image);
    format!(
        "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\": failed to resolve reference \"{full}\": {full}: not found"
    )
}

/// Why `image` is not a docker image reference, in the words of the parser the kubelet uses
/// (`reference.ParseNormalizedNamed` of distribution/reference); `None` for a valid one.
/// Grammar: `[domain/]path[:tag][@digest]`, path components of lowercase alphanumerics joined
/// by `.`, `_`, `__` or dashes.
pub fn reference_error(image: &str) -> Option<String> {
    if image.len() == 64
        && image
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Some(format!(
            "invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
        ));
    }
    reference_grammar_error(image).map(str::to_string)
}

/// [`reference_error`] past the check for a bare image id.
fn reference_grammar_error(image: &str) -> Option<&'static str> {
    const FORMAT: &str = "invalid reference format";
    // splitDockerDomain, then the lowercase check on the repository before the grammar.
    let first = image.split('/').next().unwrap_or("");
    let has_domain = image.contains('/')
        && (first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first);
    let remainder = if has_domain {
        &image[first.len() + 1..]
    } else {
        image
    };
    let remote = remainder.split(':').next().unwrap_or("");
    if remote.to_lowercase() != remote {
        return Some("invalid reference format: repository name must be lowercase");
    }
    if image.is_empty() {
        return Some("repository name must have at least one component");
    }
    let (named, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last_slash = named.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match named[last_slash..].rfind(':') {
        Some(c) => (&named[..last_slash + c], Some(&named[last_slash + c + 1..])),
        None => (named, None),
    };
    let components: Vec<&str> = name.split('/').collect();
    let path_ok = |cs: &[&str]| !cs.is_empty() && cs.iter().all(|c| is_path_component(c));
    if !(path_ok(&components) || (is_domain(components[0]) && path_ok(&components[1..]))) {
        return Some(FORMAT);
    }
    if tag.is_some_and(|t| !is_tag(t)) || digest.is_some_and(|d| !is_digest_shape(d)) {
        return Some(FORMAT);
    }
    if name.len() > 255 {
        return Some("repository name must not be more than 255 characters");
    }
    digest.and_then(digest_error)
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    // Every run of separators between alphanumerics is `.`, `_`, `__` or dashes.
    b.split(|x| alnum(*x)).all(|sep| {
        sep.is_empty() || matches!(sep, b"." | b"_" | b"__") || sep.iter().all(|x| *x == b'-')
    }) && b
        .iter()
        .all(|x| alnum(*x) || matches!(x, b'.' | b'_' | b'-'))
}

/// `host[:port]`, host being dot-separated `[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?`.
fn is_domain(d: &str) -> bool {
    let (host, port) = match d.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    let label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

/// `[\w][\w.-]{0,127}`
fn is_tag(t: &str) -> bool {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|x| word(*x) || matches!(x, b'.' | b'-'))
}

/// `algorithm:hex`, algorithm components `[A-Za-z][A-Za-z0-9]*` joined by `+.-_`, at least 32
/// hex digits: the shape the reference grammar accepts before the digest itself is checked.
fn is_digest_shape(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let component_ok = |c: &str| {
        c.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
            && c.bytes().all(|x| x.is_ascii_alphanumeric())
    };
    alg.split(['+', '.', '-', '_']).all(component_ok)
        && hex.len() >= 32
        && hex.bytes().all(|x| x.is_ascii_hexdigit())
}

/// go-digest's `Validate` of a digest of the right shape: a known algorithm with exactly its
/// length of lowercase hex.
fn digest_error(d: &str) -> Option<&'static str> {
    let (alg, hex) = d.split_once(':')?;
    let size = match alg {
        "sha256" => 32,
        "sha384" => 48,
        "sha512" => 64,
        _ => return Some("unsupported digest algorithm"),
    };
    if hex.len() != size * 2 {
        Some("invalid checksum digest length")
    } else if !hex.bytes().all(|x| matches!(x, b'0'..=b'9' | b'a'..=b'f')) {
        Some("invalid checksum digest format")
    } else {
        None
    }
}

/// The waiting message of InvalidImageName (the kubelet's image manager, which cannot apply
/// the default tag to what does not parse).
pub fn invalid_name_message(image: &str) -> String {
    let why = reference_error(image).unwrap_or_else(|| "invalid reference format".into());
    format!(
        "Failed to apply default image tag {image:?}: couldn't parse image reference {image:?}: {why}"
    )
}

/// The waiting message of ImagePullBackOff (the kubelet's image manager).
pub fn pull_backoff(image: &str) -> String {
    format!("Back-off pulling image \"{image}\"")
}

/// The kubelet's first back-off for a crashing container and for a failing pull.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The kubelet's longest back-off (`MaxContainerBackOff`, and the image pull maximum).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The back-off after `current` (client-go's `flowcontrol.Backoff.Next` without jitter): 10 s
/// first, then doubled, at most 5 min.
pub fn next_backoff(current: Option<Duration>) -> Duration {
    match current {
        None => BACKOFF_INITIAL,
        Some(d) => (d * 2).min(BACKOFF_MAX),
    }
}

/// A duration as Go's `time.Duration.String()` prints whole seconds: `10s`, `1m20s`, `5m0s`,
/// which is how the kubelet's CrashLoopBackOff message names the back-off.
pub fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{}h{}m{}s", s / 3600, (s % 3600) / 60, s % 60)
    }
}

/// `d` multiplied by `scale` (a test speed-up), never negative.
pub fn scaled(d: Duration, scale: f64) -> Duration {
    Duration::from_secs_f64((d.as_secs_f64() * scale).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_reference_decides_the_behaviour() {
        assert_eq!(
            Behaviour::of("registry.k8s.io/pause:3.9"),
            Behaviour::RunsUntilStopped
        );
        assert_eq!(
            Behaviour::of("registry.example/does-not-exist:1"),
            Behaviour::PullFails
        );
        assert_eq!(Behaviour::of("busybox"), Behaviour::ExitsAtOnce);
        assert_eq!(
            Behaviour::of("docker.io/library/busybox:1.36"),
            Behaviour::ExitsAtOnce
        );
        assert_eq!(
            Behaviour::of(&format!(
                "localhost:5000/busybox@sha256:{}",
                "ab".repeat(32)
            )),
            Behaviour::ExitsAtOnce
        );
        assert_eq!(
            Behaviour::of("busybox-extra:1"),
            Behaviour::RunsUntilStopped
        );
        assert_eq!(
            Behaviour::of("quay.io/x/ignore-sigterm:2"),
            Behaviour::IgnoresSigterm
        );
    }

    #[test]
    fn versions_never_published_fail_to_pull_and_known_ones_run() {
        // The README's stuck example, and every image the tests and the bench use.
        for never in [
            "nginx:9.99",
            "nginx:2",
            "docker.io/library/nginx:10.1",
            "busybox:2.0",
            "registry.k8s.io/pause:4.0",
        ] {
            assert_eq!(Behaviour::of(never), Behaviour::PullFails, "{never}");
        }
        for runs in [
            "nginx",
            "nginx:latest",
            "nginx:1",
            "nginx:1.27",
            "nginx:1.27.3-alpine",
            "nginx:stable",
            &format!("nginx@sha256:{}", "0f".repeat(32)),
            "registry.k8s.io/pause:3.9",
            "registry.k8s.io/pause:3.10",
            "mirror.example/nginx:9.99",
            "localhost:5000/nginx",
        ] {
            assert_eq!(Behaviour::of(runs), Behaviour::RunsUntilStopped, "{runs}");
        }
        assert_eq!(Behaviour::of("busybox:1.36"), Behaviour::ExitsAtOnce);
        assert_eq!(
            pull_error("nginx:9.99"),
            "rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/library/nginx:9.99\": failed to resolve reference \"docker.io/library/nginx:9.99\": docker.io/library/nginx:9.99: not found"
        );
    }

    #[test]
    fn short_names_resolve_to_docker_hub_with_latest() {
        assert_eq!(normalize("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(normalize("nginx:1.27"), "docker.io/library/nginx:1.27");
        assert_eq!(normalize("team/app"), "docker.io/team/app:latest");
        assert_eq!(
            normalize("registry.k8s.io/pause:3.9"),
            "registry.k8s.io/pause:3.9"
        );
        assert_eq!(normalize("localhost:5000/app"), "localhost:5000/app:latest");
        assert!(image_id("nginx:1.27").starts_with("docker.io/library/nginx@sha256:"));
        assert_eq!(
            image_id("nginx:1.27").len(),
            "docker.io/library/nginx@sha256:".len() + 64
        );
    }

    #[test]
    fn references_the_kubelet_cannot_parse_are_invalid_names() {
        let digest = format!("x@sha256:{}", "a1".repeat(32));
        for valid in [
            "nginx",
            "nginx:1.27",
            "registry:5000/a/b:tag",
            digest.as_str(),
            "localhost/app",
            "my-registry.example.com/team/app_x__y.z--w:v1.2-rc_3",
        ] {
            assert_eq!(reference_error(valid), None, "{valid}");
        }
        assert_eq!(
            invalid_name_message("NGINX:::Latest@@"),
            "Failed to apply default image tag \"NGINX:::Latest@@\": couldn't parse image reference \"NGINX:::Latest@@\": invalid reference format: repository name must be lowercase"
        );
        for (bad, why) in [
            ("nginx:::latest", "invalid reference format"),
            ("nginx:1.27@@", "invalid reference format"),
            ("-nginx", "invalid reference format"),
            ("a//b", "invalid reference format"),
            ("nginx@sha256:abc", "invalid reference format"),
            (
                "nginx@sha256:0123456789abcdef0123456789abcdef",
                "invalid checksum digest length",
            ),
            (
                "team/App",
                "invalid reference format: repository name must be lowercase",
            ),
        ] {
            assert_eq!(reference_error(bad).as_deref(), Some(why), "{bad}");
        }
        assert_eq!(Behaviour::of("NGINX:::Latest@@"), Behaviour::InvalidName);
    }

    #[test]
    fn backoff_doubles_from_ten_seconds_to_five_minutes() {
        let mut d = None;
        let mut seen = Vec::new();
        for _ in 0..7 {
            let next = next_backoff(d);
            seen.push(go_duration(next));
            d = Some(next);
        }
        assert_eq!(
            seen,
            ["10s", "20s", "40s", "1m20s", "2m40s", "5m0s", "5m0s"]
        );
    }

    #[test]
    fn pull_messages_name_the_resolved_reference() {
        assert_eq!(
            pull_error("does-not-exist:1"),
            "rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/library/does-not-exist:1\": failed to resolve reference \"docker.io/library/does-not-exist:1\": docker.io/library/does-not-exist:1: not found"
        );
        assert_eq!(pull_backoff("x"), "Back-off pulling image \"x\"");
    }
}
