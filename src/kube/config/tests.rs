//! Tests of loading a cluster's configuration: kubeconfig files, in-cluster, proxies, servers.

use super::*;
use crate::kube::tls::tests::{fixture, get, one_shot_server};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A scratch directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "immortal-config-test-{}-{n}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `contents` to `relative` (creating directories) and returns the full path.
    pub(crate) fn write(&self, relative: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An environment with nothing set; the service account dir does not exist.
pub(crate) fn empty_env(dir: &TempDir) -> Env {
    Env {
        kubeconfig_var: None,
        home: None,
        service_host: None,
        service_port: None,
        sa_dir: dir.0.join("no-service-account"),
        proxies: ProxyEnv::default(),
    }
}

pub(crate) fn with_file(path: &Path) -> LoadOptions {
    LoadOptions {
        kubeconfig: Some(path.to_path_buf()),
        context: None,
    }
}

/// A proxy of `url`, as a kubeconfig's `proxy-url` gives it.
pub(crate) fn proxy_for_test(url: &str) -> Proxy {
    proxy::from_kubeconfig(url, "test").unwrap()
}

pub(crate) fn b64_fixture(name: &str) -> String {
    base64_encode(&fixture(name))
}

/// A one-context kubeconfig: `cluster_fields` and `user_fields` are YAML lines indented for
/// the cluster and user bodies.
pub(crate) fn kubeconfig(server: &str, cluster_fields: &str, user_fields: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test-cluster
  cluster:
    server: {server}
{cluster_fields}
users:
- name: test-user
  user:
{user_fields}
contexts:
- name: test
  context:
    cluster: test-cluster
    user: test-user
    namespace: team-a
current-context: test
preferences: {{}}
"
    )
}

fn load_file(path: &Path) -> Result<ClusterConfig, ConfigError> {
    let dir = TempDir::new("env");
    load_with_env(&with_file(path), &empty_env(&dir))
}

#[test]
fn cluster_config_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ClusterConfig>();
    shareable::<Credentials>();
}

#[test]
fn token_user_gets_bearer_header_and_context_namespace() {
    let dir = TempDir::new("token");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443/",
            &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
            "    token: abc.def",
        ),
    );
    let config = load_file(&path).unwrap();
    assert_eq!(config.server, "https://127.0.0.1:6443");
    assert_eq!(config.default_namespace.as_deref(), Some("team-a"));
    assert_eq!(
        config.source,
        format!("kubeconfig {}, context test", path.display())
    );
    assert_ne!(config.source, "in-cluster");
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer abc.def")
    );
}

#[test]
fn token_file_is_relative_to_the_kubeconfig_directory() {
    let dir = TempDir::new("tokenfile");
    dir.write("kube/secrets/token", "from-file\n");
    let path = dir.write(
        "kube/config",
        kubeconfig("https://127.0.0.1:6443", "", "    tokenFile: secrets/token"),
    );
    let config = load_file(&path).unwrap();
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer from-file")
    );
}

#[test]
fn user_without_credentials_is_anonymous() {
    let dir = TempDir::new("anon");
    let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", "    {}"));
    let config = load_file(&path).unwrap();
    assert_eq!(config.credentials.authorization().unwrap(), None);
}

#[test]
fn server_without_scheme_means_https() {
    let dir = TempDir::new("scheme");
    let path = dir.write("config", kubeconfig("10.0.0.1:6443", "", "    {}"));
    assert_eq!(load_file(&path).unwrap().server, "https://10.0.0.1:6443");
}

/// Loads a kubeconfig pointing at a one-shot server and GETs / with its TLS config.
fn handshake(
    server_cert: &str,
    require_client_cert: bool,
    cluster_fields: &str,
    user_fields: &str,
) -> (
    Result<String, String>,
    crate::kube::tls::tests::ServerOutcome,
) {
    let (port, rx) = one_shot_server(
        server_cert,
        &server_cert.replace(".crt", ".key"),
        require_client_cert,
    );
    let dir = TempDir::new("handshake");
    for name in ["ca.crt", "client-rsa.crt", "client-rsa.key"] {
        dir.write(&format!("pki/{name}"), fixture(name));
    }
    let path = dir.write(
        "config",
        kubeconfig(
            &format!("https://127.0.0.1:{port}"),
            cluster_fields,
            user_fields,
        ),
    );
    let config = load_file(&path).unwrap();
    let result = get(config.tls_config().unwrap(), "127.0.0.1", port);
    let outcome = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| Err("server did not finish".into()));
    (result, outcome)
}

fn der(name: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(&fixture(name))
        .unwrap()
        .to_vec()
}

#[test]
fn client_certificate_files_and_ca_file_authenticate_over_tls() {
    let (result, outcome) = handshake(
        "server.crt",
        true,
        "    certificate-authority: pki/ca.crt",
        "    client-certificate: pki/client-rsa.crt\n    client-key: pki/client-rsa.key",
    );
    assert_eq!(result.unwrap(), "ok");
    assert_eq!(outcome.unwrap(), Some(der("client-rsa.crt")));
}

#[test]
fn client_certificate_data_and_ca_data_authenticate_over_tls() {
    let (result, outcome) = handshake(
        "server.crt",
        true,
        &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            b64_fixture("client-ec.crt"),
            b64_fixture("client-ec.key")
        ),
    );
    assert_eq!(result.unwrap(), "ok");
    assert_eq!(outcome.unwrap(), Some(der("client-ec.crt")));
}

#[test]
fn tls_server_name_reaches_dns_only_server_by_ip() {
    let (result, _) = handshake(
        "server-dns-only.crt",
        false,
        "    certificate-authority: pki/ca.crt\n    tls-server-name: kubernetes.test",
        "    token: t",
    );
    assert_eq!(result.unwrap(), "ok");
}

#[test]
fn without_tls_server_name_dns_only_server_is_refused() {
    let (result, _) = handshake(
        "server-dns-only.crt",
        false,
        "    certificate-authority: pki/ca.crt",
        "    token: t",
    );
    assert!(result.unwrap_err().contains("not valid for name"));
}

/// The error a client over the kubeconfig with `cluster_fields` gets from a one-shot server
/// showing `server_cert`, and the line start-up would exit with for it.
fn refused_handshake(server_cert: &str, cluster_fields: &str) -> (String, Option<String>) {
    let (port, _rx) = one_shot_server(server_cert, &server_cert.replace(".crt", ".key"), false);
    let dir = TempDir::new("refused");
    dir.write("pki/other-ca.crt", fixture("other-ca.crt"));
    let path = dir.write(
        "config",
        kubeconfig(
            &format!("https://127.0.0.1:{port}"),
            cluster_fields,
            "    token: t",
        ),
    );
    let client = crate::kube::client::Client::new(load_file(&path).unwrap(), 1).unwrap();
    match client.get_path::<serde_json::Value>("/") {
        Err(crate::kube::client::Error::Tls(e)) => {
            (e.to_string(), client.config().tls_misconfigured(&e))
        }
        other => panic!("want a TLS error, got {other:?}"),
    }
}

#[test]
fn a_server_certificate_the_ca_does_not_verify_names_the_certificate_authority_field() {
    let (error, line) =
        refused_handshake("server.crt", "    certificate-authority: pki/other-ca.crt");
    let line = line.unwrap_or_else(|| panic!("{error} is a configuration error"));
    assert!(
        line.contains("cluster \"test-cluster\", certificate-authority ")
            && line.contains("other-ca.crt")
            && line.contains("UnknownIssuer"),
        "{line}"
    );
    assert!(!line.contains('\n'), "{line}");
}

#[test]
fn a_server_certificate_for_another_name_says_to_set_tls_server_name() {
    let (error, line) = refused_handshake(
        "server-dns-only.crt",
        &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
    );
    let line = line.unwrap_or_else(|| panic!("{error} is a configuration error"));
    assert!(
        line.contains("tls-server-name") && line.contains("server https://127.0.0.1:"),
        "{line}"
    );
}

#[test]
fn a_malformed_server_url_is_refused_at_load_naming_the_server_field() {
    let dir = TempDir::new("bad-url");
    for bad in [
        "https://127.0.0.1:99999",
        "https://exa mple.com:6443",
        "https://:6443",
        // No `://`: a bare host[:port] for client-go, which may have no path.
        "htps//127.0.0.1:6443",
        "https:/127.0.0.1:6443",
        "/api/v1",
        "127.0.0.1:6443/prefix",
        "https://",
        "https:///prefix",
    ] {
        let path = dir.write("config", kubeconfig(bad, "", "    {}"));
        let err = load_file(&path).unwrap_err().to_string();
        let file = path.display().to_string();
        assert!(
            err.contains(&format!("kubeconfig {file}"))
                && err.contains("cluster \"test-cluster\": server")
                && err.contains("not a valid URL"),
            "{bad}: {err}"
        );
    }
    for bad in ["htps://127.0.0.1:6443", "ftp://api:6443"] {
        let path = dir.write("config", kubeconfig(bad, "", "    {}"));
        let err = load_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("server") && err.contains("not an http:// or https:// URL"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_server_url_carrying_a_user_and_password_is_refused_at_load_without_printing_them() {
    let dir = TempDir::new("userinfo-url");
    for bad in [
        "https://admin:s3cret@10.0.0.1:6443",
        "admin:s3cret@10.0.0.1:6443",
        "https://admin@10.0.0.1:6443/prefix",
        // Malformed besides: the user info is still what is said, and never echoed.
        "https://admin:s3cret@exa mple.com:6443",
    ] {
        let path = dir.write("config", kubeconfig(bad, "", "    {}"));
        let err = load_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("cluster \"test-cluster\": server")
                && err.contains("user name or password")
                && err.contains("users["),
            "{bad}: {err}"
        );
        assert!(
            !err.contains("s3cret"),
            "{bad}: the password is printed: {err}"
        );
        assert!(!err.contains('\n'), "{bad}: {err}");
    }
}

#[test]
fn a_server_is_a_url_or_a_bare_host_and_port_as_client_go_reads_it() {
    let dir = TempDir::new("good-url");
    for (given, want) in [
        ("127.0.0.1:6443", "https://127.0.0.1:6443"),
        ("api.corp", "https://api.corp"),
        ("api.corp:6443/", "https://api.corp:6443"),
        ("http://api.corp:8080", "http://api.corp:8080"),
        (
            "https://api.corp/k8s/clusters/c-1/",
            "https://api.corp/k8s/clusters/c-1",
        ),
        ("https://[fd00::1]:6443", "https://[fd00::1]:6443"),
    ] {
        let path = dir.write("config", kubeconfig(given, "", "    {}"));
        let config = load_file(&path).unwrap_or_else(|e| panic!("{given}: {e}"));
        assert_eq!(config.server, want);
    }
}

#[test]
fn insecure_skip_tls_verify_accepts_unverifiable_server() {
    let (result, _) = handshake(
        "server-dns-only.crt",
        false,
        "    insecure-skip-tls-verify: true",
        "    token: t",
    );
    assert_eq!(result.unwrap(), "ok");
}

#[test]
fn insecure_together_with_ca_is_refused() {
    let dir = TempDir::new("insecure-ca");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            &format!(
                "    insecure-skip-tls-verify: true\n    certificate-authority-data: {}",
                b64_fixture("ca.crt")
            ),
            "    token: t",
        ),
    );
    let err = load_file(&path).unwrap_err();
    assert_eq!(
            err.to_string(),
            format!(
                "kubeconfig {}, cluster \"test-cluster\": certificate-authority and insecure-skip-tls-verify cannot both be set",
                path.display()
            )
        );
}

/// Two kubeconfigs that define the same names differently.
fn two_files(dir: &TempDir) -> (PathBuf, PathBuf) {
    let a = dir.write(
        "a/config",
        "clusters:
- name: shared
  cluster: {server: 'https://a.example:6443'}
users:
- name: shared
  user: {token: from-a}
contexts:
- name: ctx-a
  context: {cluster: shared, user: shared, namespace: ns-a}
current-context: ctx-a
",
    );
    let b = dir.write(
        "b/config",
        "clusters:
- name: shared
  cluster: {server: 'https://b.example:6443'}
- name: only-b
  cluster: {server: 'https://only-b.example:6443'}
users:
- name: shared
  user: {token: from-b}
contexts:
- name: ctx-a
  context: {cluster: only-b, user: shared}
- name: ctx-b
  context: {cluster: only-b, user: shared, namespace: ns-b}
current-context: ctx-b
",
    );
    (a, b)
}

#[test]
fn kubeconfig_list_merges_with_first_file_winning() {
    let dir = TempDir::new("merge");
    let (a, b) = two_files(&dir);
    let missing = dir.0.join("missing/config");
    let mut env = empty_env(&dir);
    env.kubeconfig_var = Some(format!(
        "{}::{}:{}:",
        missing.display(),
        a.display(),
        b.display()
    ));

    // current-context and ctx-a come from a; ctx-a's cluster "shared" from a as well.
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.server, "https://a.example:6443");
    assert_eq!(config.default_namespace.as_deref(), Some("ns-a"));
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer from-a")
    );

    // ctx-b exists only in b; its user "shared" is taken from a, the first file.
    let opts = LoadOptions {
        kubeconfig: None,
        context: Some("ctx-b".into()),
    };
    let config = load_with_env(&opts, &env).unwrap();
    assert_eq!(config.server, "https://only-b.example:6443");
    assert_eq!(config.default_namespace.as_deref(), Some("ns-b"));
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer from-a")
    );
    assert_eq!(
        config.source,
        format!("kubeconfig {}, context ctx-b", b.display())
    );

    // Reversed, b wins everything.
    env.kubeconfig_var = Some(format!("{}:{}", b.display(), a.display()));
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.server, "https://only-b.example:6443");
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer from-b")
    );
}

#[test]
fn current_context_comes_from_the_first_file_that_sets_it() {
    let dir = TempDir::new("merge-current");
    let (_, b) = two_files(&dir);
    let first = dir.write(
        "first/config",
        "clusters: null\nusers: null\ncontexts: null\n",
    );
    let mut env = empty_env(&dir);
    env.kubeconfig_var = Some(format!("{}:{}", first.display(), b.display()));
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.default_namespace.as_deref(), Some("ns-b"));
}

#[test]
fn kubeconfig_flag_wins_over_kubeconfig_variable_and_home() {
    let dir = TempDir::new("precedence");
    let (a, b) = two_files(&dir);
    let home = dir.0.join("home");
    dir.write("home/.kube/config", std::fs::read(&a).unwrap());
    let mut env = empty_env(&dir);
    env.kubeconfig_var = Some(a.display().to_string());
    env.home = Some(home.clone());

    let config = load_with_env(&with_file(&b), &env).unwrap();
    assert_eq!(config.server, "https://only-b.example:6443");

    env.kubeconfig_var = Some(b.display().to_string());
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.server, "https://only-b.example:6443");

    env.kubeconfig_var = None;
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.server, "https://a.example:6443");
    assert!(config.source.contains(".kube/config"));
}

#[test]
fn context_flag_selects_another_context() {
    let dir = TempDir::new("context");
    let (_, b) = two_files(&dir);
    let opts = LoadOptions {
        kubeconfig: Some(b.clone()),
        context: Some("ctx-a".into()),
    };
    let config = load_with_env(&opts, &empty_env(&dir)).unwrap();
    assert_eq!(config.default_namespace, None);
    assert_eq!(
        config.source,
        format!("kubeconfig {}, context ctx-a", b.display())
    );
}

#[test]
fn unknown_context_names_the_file_and_the_available_contexts() {
    let dir = TempDir::new("unknown-context");
    let (_, b) = two_files(&dir);
    let opts = LoadOptions {
        kubeconfig: Some(b.clone()),
        context: Some("foo".into()),
    };
    let err = load_with_env(&opts, &empty_env(&dir)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "kubeconfig {}: context \"foo\" not found (available: ctx-a, ctx-b)",
            b.display()
        )
    );
}

#[test]
fn context_naming_a_missing_cluster_or_user_is_an_error() {
    let dir = TempDir::new("dangling");
    let path = dir.write(
        "config",
        "clusters:
- name: real
  cluster: {server: 'https://x:1'}
contexts:
- name: no-cluster
  context: {cluster: gone, user: u}
- name: no-user
  context: {cluster: real, user: ghost}
",
    );
    let opts = |c: &str| LoadOptions {
        kubeconfig: Some(path.clone()),
        context: Some(c.into()),
    };
    let err = load_with_env(&opts("no-cluster"), &empty_env(&dir)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "kubeconfig {}, context \"no-cluster\": cluster \"gone\" not found (available: real)",
            path.display()
        )
    );
    let err = load_with_env(&opts("no-user"), &empty_env(&dir)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "kubeconfig {}, context \"no-user\": user \"ghost\" not found (available: none)",
            path.display()
        )
    );
}

#[test]
fn empty_kubeconfig_has_no_current_context() {
    let dir = TempDir::new("empty");
    let path = dir.write("config", "");
    let err = load_file(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "kubeconfig {}: no current-context set and no --context given (available: none)",
            path.display()
        )
    );
}

#[test]
fn missing_kubeconfig_file_names_the_path() {
    let dir = TempDir::new("missing");
    let path = dir.0.join("nope/config");
    let err = load_file(&path).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("kubeconfig: cannot read {}: ", path.display())),
        "{text}"
    );
}

#[test]
fn file_that_is_not_yaml_is_a_parse_error_naming_the_path() {
    let dir = TempDir::new("bad-yaml");
    let path = dir.write("config", "clusters: [\n  - {name: x\n");
    let err = load_file(&path).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }));
    assert!(err.to_string().starts_with(&format!(
        "kubeconfig {}: invalid kubeconfig: ",
        path.display()
    )));
}

#[test]
fn plain_text_given_as_kubeconfig_says_it_is_not_one_without_naming_our_types() {
    let dir = TempDir::new("plain-text");
    let path = dir.write("config", "just some notes\n");
    let text = load_file(&path).unwrap_err().to_string();
    assert!(text.contains("expected a kubeconfig"), "{text}");
    assert!(!text.contains("Raw"), "{text}");
    let path = dir.write("other", "clusters:\n- name: c\n  cluster: a-string\n");
    let text = load_file(&path).unwrap_err().to_string();
    assert!(text.contains("expected a cluster"), "{text}");
    assert!(!text.contains("Raw"), "{text}");
}

#[test]
fn misplaced_value_is_not_echoed_in_the_parse_error() {
    let dir = TempDir::new("bad-type");
    let path = dir.write(
            "config",
            "clusters:\n- name: c\n  cluster: {server: 'https://x:1', insecure-skip-tls-verify: s3cr3t-t0ken}\n",
        );
    let text = load_file(&path).unwrap_err().to_string();
    assert!(!text.contains("s3cr3t"), "{text}");
    assert!(text.contains("expected a boolean"), "{text}");
}

#[test]
fn missing_client_key_file_names_field_and_path() {
    let dir = TempDir::new("missing-key");
    dir.write("client.crt", fixture("client-rsa.crt"));
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "",
            "    client-certificate: client.crt\n    client-key: client.key",
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    let expected = format!(
        "kubeconfig {}, user \"test-user\", client-key: cannot read {}: ",
        path.display(),
        dir.0.join("client.key").display()
    );
    assert!(text.starts_with(&expected), "{text}");
}

#[test]
fn unreadable_certificate_names_its_field() {
    let dir = TempDir::new("bad-ca");
    dir.write("ca.crt", "this is not PEM");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "    certificate-authority: ca.crt",
            "    token: t",
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert_eq!(
            text,
            format!(
                "kubeconfig {}, cluster \"test-cluster\", certificate-authority {}: bad certificate authority: no certificate found in PEM",
                path.display(),
                dir.0.join("ca.crt").display()
            )
        );
}

#[test]
fn bad_base64_names_the_data_field() {
    let dir = TempDir::new("bad-b64");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "    certificate-authority-data: 'abc$def'",
            "",
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert_eq!(
            text,
            format!(
                "kubeconfig {}, cluster \"test-cluster\", certificate-authority-data: invalid base64: unexpected character at offset 3",
                path.display()
            )
        );
}

#[test]
fn key_of_another_type_than_the_certificate_is_refused() {
    let dir = TempDir::new("mismatch");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "",
            &format!(
                "    client-certificate-data: {}\n    client-key-data: {}",
                b64_fixture("client-rsa.crt"),
                b64_fixture("client-ec.key")
            ),
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert_eq!(
            text,
            format!(
                "kubeconfig {}, user \"test-user\", client-key-data: client key does not match client certificate",
                path.display()
            )
        );
}

#[test]
fn certificate_without_key_is_refused() {
    let dir = TempDir::new("half-pair");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "",
            &format!(
                "    client-certificate-data: {}",
                b64_fixture("client-rsa.crt")
            ),
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert!(
        text.ends_with("client-certificate is set but client-key is not"),
        "{text}"
    );
}

#[test]
fn auth_provider_is_refused_with_a_pointer_to_exec() {
    let dir = TempDir::new("auth-provider");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "",
            "    auth-provider:\n      name: gcp\n      config: {access-token: s3cr3t}",
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert!(
        text.contains("auth-provider \"gcp\" is not supported"),
        "{text}"
    );
    assert!(text.contains("exec"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
}

#[test]
fn basic_auth_is_refused() {
    let dir = TempDir::new("basic");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://127.0.0.1:6443",
            "",
            "    username: admin\n    password: s3cr3t",
        ),
    );
    let text = load_file(&path).unwrap_err().to_string();
    assert!(text.contains("basic auth) is not supported"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
}

#[test]
fn debug_output_never_shows_the_token() {
    let dir = TempDir::new("debug");
    let path = dir.write(
        "config",
        kubeconfig("https://127.0.0.1:6443", "", "    token: s3cr3t-t0ken"),
    );
    let config = load_file(&path).unwrap();
    let debug = format!("{config:?} {:?}", config.credentials);
    assert!(!debug.contains("s3cr3t"), "{debug}");
    assert!(debug.contains("redacted"), "{debug}");
}

fn service_account(dir: &TempDir, token: &str) -> PathBuf {
    dir.write("sa/token", token);
    dir.write("sa/ca.crt", fixture("ca.crt"));
    dir.write("sa/namespace", "operators\n");
    dir.0.join("sa")
}

#[test]
fn in_cluster_uses_service_account_files() {
    let dir = TempDir::new("in-cluster");
    let mut env = empty_env(&dir);
    env.sa_dir = service_account(&dir, "sa-token\n");
    env.service_host = Some("10.96.0.1".into());
    env.service_port = Some("443".into());
    // The home directory exists but has no kubeconfig: fall through to in-cluster.
    env.home = Some(dir.0.clone());
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.source, "in-cluster");
    assert_eq!(config.server, "https://10.96.0.1:443");
    assert_eq!(config.source, "in-cluster");
    assert_eq!(config.default_namespace.as_deref(), Some("operators"));
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer sa-token")
    );
    assert!(config.tls_config().is_ok());
}

#[test]
fn in_cluster_ipv6_host_gets_brackets() {
    let dir = TempDir::new("in-cluster-v6");
    let mut env = empty_env(&dir);
    env.sa_dir = service_account(&dir, "t");
    env.service_host = Some("fd00:10:96::1".into());
    env.service_port = Some("443".into());
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.server, "https://[fd00:10:96::1]:443");
}

#[test]
fn kubeconfig_variable_naming_only_missing_files_falls_back_to_in_cluster() {
    let dir = TempDir::new("in-cluster-fallback");
    let mut env = empty_env(&dir);
    env.kubeconfig_var = Some(dir.0.join("missing").display().to_string());
    env.sa_dir = service_account(&dir, "t");
    env.service_host = Some("10.96.0.1".into());
    env.service_port = Some("443".into());
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    assert_eq!(config.source, "in-cluster");

    env.service_host = None;
    let text = load_with_env(&LoadOptions::default(), &env)
        .unwrap_err()
        .to_string();
    assert_eq!(
            text,
            format!(
                "no kubernetes configuration found: no --kubeconfig given, none of the files in KUBECONFIG={} exist, not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)",
                dir.0.join("missing").display()
            )
        );
}

#[test]
fn in_cluster_without_token_names_the_token_file() {
    let dir = TempDir::new("in-cluster-no-token");
    let mut env = empty_env(&dir);
    env.service_host = Some("10.96.0.1".into());
    env.service_port = Some("443".into());
    let text = load_with_env(&LoadOptions::default(), &env)
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with(&format!(
            "in-cluster service account token: cannot read {}",
            env.sa_dir.join("token").display()
        )),
        "{text}"
    );
}

#[test]
fn nothing_configured_explains_what_was_tried() {
    let dir = TempDir::new("nothing");
    let mut env = empty_env(&dir);
    env.home = Some(dir.0.clone());
    let text = load_with_env(&LoadOptions::default(), &env)
        .unwrap_err()
        .to_string();
    assert_eq!(
            text,
            format!(
                "no kubernetes configuration found: no --kubeconfig given, {} does not exist, not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)",
                dir.0.join(".kube/config").display()
            )
        );
}

#[test]
fn context_flag_without_any_kubeconfig_is_an_error_even_in_cluster() {
    let dir = TempDir::new("context-in-cluster");
    let mut env = empty_env(&dir);
    env.sa_dir = service_account(&dir, "t");
    env.service_host = Some("10.96.0.1".into());
    env.service_port = Some("443".into());
    let opts = LoadOptions {
        kubeconfig: None,
        context: Some("prod".into()),
    };
    let text = load_with_env(&opts, &env).unwrap_err().to_string();
    assert!(
        text.contains("--context \"prod\" given but no kubeconfig was found"),
        "{text}"
    );
}

#[test]
fn base64_decoder_handles_padding_whitespace_and_errors() {
    assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
    assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
    assert_eq!(base64_decode("aGVs\n bG8h\r\n").unwrap(), b"hello!");
    assert_eq!(base64_decode("").unwrap(), b"");
    assert_eq!(base64_decode("+/+/").unwrap(), vec![0xfb, 0xff, 0xbf]);
    assert_eq!(
        base64_decode("aGVsbG8=x").unwrap_err(),
        "invalid base64: data after padding at offset 8"
    );
    assert_eq!(
        base64_decode("a-b").unwrap_err(),
        "invalid base64: unexpected character at offset 1"
    );
    assert_eq!(
        base64_decode("aGVsb").unwrap_err(),
        "invalid base64: truncated input"
    );
}

#[test]
fn base64_encoder_round_trips_every_length() {
    let data: Vec<u8> = (0..=255u8).collect();
    for len in [0, 1, 2, 3, 4, 5, 255, 256] {
        let encoded = base64_encode(&data[..len]);
        assert_eq!(encoded.len() % 4, 0);
        assert_eq!(base64_decode(&encoded).unwrap(), &data[..len]);
    }
    assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
}

#[test]
fn a_clusters_proxy_url_wins_over_the_environment_and_applies_to_loopback_too() {
    let dir = TempDir::new("proxy-url");
    let mut env = empty_env(&dir);
    env.proxies.https_proxy = Some("http://from-env:3128".into());
    let with = dir.write(
        "with",
        kubeconfig(
            "https://127.0.0.1:6443",
            "    proxy-url: http://from-kubeconfig:8080",
            "    {}",
        ),
    );
    let config = load_with_env(&with_file(&with), &env).unwrap();
    assert_eq!(
        config.proxy.map(|p| p.shown).as_deref(),
        Some("http://from-kubeconfig:8080")
    );
    let without = dir.write("without", kubeconfig("https://10.0.0.1:6443", "", "    {}"));
    let config = load_with_env(&with_file(&without), &env).unwrap();
    assert_eq!(
        config.proxy.map(|p| p.shown).as_deref(),
        Some("http://from-env:3128")
    );
    env.proxies.no_proxy = Some("10.0.0.0/8".into());
    assert!(load_with_env(&with_file(&without), &env)
        .unwrap()
        .proxy
        .is_none());
}

#[test]
fn a_socks_proxy_url_is_refused_naming_the_field() {
    let dir = TempDir::new("socks");
    let path = dir.write(
        "config",
        kubeconfig(
            "https://10.0.0.1:6443",
            "    proxy-url: socks5://p:1080",
            "    {}",
        ),
    );
    let err = load_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("cluster \"test-cluster\", proxy-url: a socks5:// proxy is not supported"),
        "{err}"
    );
}

#[test]
fn no_debug_output_of_a_configuration_with_proxies_shows_their_passwords() {
    let dir = TempDir::new("proxy-debug");
    let mut env = empty_env(&dir);
    env.proxies.https_proxy = Some("http://envuser:env-s3cret@from-env:3128".into());
    env.proxies.http_proxy = Some("envuser:env-s3cret@plain:8080".into());
    let with = dir.write(
        "with",
        kubeconfig(
            "https://10.0.0.1:6443",
            "    proxy-url: http://op:kc-s3cret@from-kubeconfig:8080",
            "    {}",
        ),
    );
    let without = dir.write("without", kubeconfig("https://10.0.0.1:6443", "", "    {}"));
    let shown = [
        format!("{env:?}"),
        format!("{:?}", env.proxies),
        format!("{:?}", load_with_env(&with_file(&with), &env).unwrap()),
        format!("{:?}", load_with_env(&with_file(&without), &env).unwrap()),
    ];
    for shown in shown {
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
