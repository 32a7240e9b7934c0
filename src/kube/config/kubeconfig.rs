//! kubeconfig files as kubectl writes and merges them, with client-go's loading rules.

use super::*;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::DecodeError;

/// A kubeconfig file as written by kubectl; lists may be null, as kubectl writes them.
#[derive(Deserialize, Default)]
pub(super) struct RawConfig {
    clusters: Option<Vec<Named<RawCluster>>>,
    users: Option<Vec<Named<RawUser>>>,
    contexts: Option<Vec<Named<RawContext>>>,
    #[serde(rename = "current-context")]
    current_context: Option<String>,
}

/// `{name, cluster|user|context}`: the body's key differs per list, so all three are accepted.
#[derive(Deserialize)]
pub(super) struct Named<T> {
    name: String,
    #[serde(default, rename = "cluster", alias = "user", alias = "context")]
    body: Option<T>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
    extensions: Option<Vec<RawExtension>>,
}

#[derive(Deserialize)]
pub(super) struct RawExtension {
    name: String,
    extension: Option<serde_yaml::Value>,
}

/// Deliberately not Debug: it holds tokens and keys.
#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    auth_provider: Option<RawAuthProvider>,
    exec: Option<RawExec>,
}

#[derive(Deserialize)]
pub(super) struct RawAuthProvider {
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawExec {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<RawEnvVar>>,
    api_version: Option<String>,
    install_hint: Option<String>,
    provide_cluster_info: Option<bool>,
    interactive_mode: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawEnvVar {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

/// An entry and the file that defined it (relative paths inside resolve against its directory).
pub(super) struct Defined<T> {
    file: PathBuf,
    value: T,
}

#[derive(Default)]
pub(super) struct Merged {
    pub(super) files: Vec<PathBuf>,
    clusters: BTreeMap<String, Defined<RawCluster>>,
    users: BTreeMap<String, Defined<RawUser>>,
    contexts: BTreeMap<String, Defined<RawContext>>,
    current_context: Option<(String, PathBuf)>,
}

impl Merged {
    fn label(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        format!("kubeconfig {}", files.join(":"))
    }
}

/// Reads and merges kubeconfig files as kubectl merges KUBECONFIG: for every name, and for
/// current-context, the first file that sets it wins. Missing files are an error if `must_exist`.
pub(super) fn merge_files(paths: &[PathBuf], must_exist: bool) -> Result<Merged, ConfigError> {
    let mut merged = Merged::default();
    for path in paths {
        let text = match std::fs::read_to_string(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && !must_exist => continue,
            text => text.map_err(|error| ConfigError::Read {
                what: "kubeconfig".into(),
                path: path.clone(),
                error,
            })?,
        };
        let raw = parse_kubeconfig(&text).map_err(|error| ConfigError::Parse {
            path: path.clone(),
            error,
        })?;
        merged.files.push(path.clone());
        add_new(&mut merged.clusters, raw.clusters, path);
        add_new(&mut merged.users, raw.users, path);
        add_new(&mut merged.contexts, raw.contexts, path);
        let current = set(&raw.current_context).map(|c| (c.to_string(), path.clone()));
        merged.current_context = merged.current_context.or(current);
    }
    Ok(merged)
}

/// Adds the entries of `file` whose names no earlier file defined.
fn add_new<T: Default>(
    defined: &mut BTreeMap<String, Defined<T>>,
    entries: Option<Vec<Named<T>>>,
    file: &Path,
) {
    for Named { name, body } in entries.unwrap_or_default() {
        defined.entry(name).or_insert_with(|| Defined {
            file: file.to_path_buf(),
            value: body.unwrap_or_default(),
        });
    }
}

pub(super) fn parse_kubeconfig(text: &str) -> Result<RawConfig, String> {
    // An empty file is a valid, empty kubeconfig to kubectl; serde_yaml would call it an error.
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| readable(&redact_values(&e.to_string())))
}

/// serde's message with our types' names replaced by what the file should hold there.
fn readable(message: &str) -> String {
    const SHAPES: [(&str, &str); 9] = [
        ("struct RawConfig", "a kubeconfig (a YAML mapping with clusters, users and contexts); is this file a kubeconfig?"),
        ("struct RawCluster", "a cluster (a mapping with server, certificate-authority, ...)"),
        ("struct RawUser", "a user (a mapping with token, client-certificate, exec, ...)"),
        ("struct RawContext", "a context (a mapping with cluster, user and namespace)"),
        ("struct RawExec", "an exec plugin (a mapping with command, args, ...)"),
        ("struct RawAuthProvider", "an auth-provider mapping"),
        ("struct RawExtension", "an extension (a mapping with name and extension)"),
        ("struct RawEnvVar", "an environment variable (a mapping with name and value)"),
        ("struct Named", "an entry (a mapping with name and cluster, user or context)"),
    ];
    SHAPES
        .iter()
        .fold(message.to_string(), |m, (ours, theirs)| {
            m.replace(ours, theirs)
        })
}

pub(super) fn from_kubeconfig(
    merged: &Merged,
    context: Option<&str>,
) -> Result<ClusterConfig, ConfigError> {
    let (context_name, named_in) = match (context, &merged.current_context) {
        (Some(name), _) => (name.to_string(), merged.label()),
        (None, Some((name, file))) => (name.clone(), format!("kubeconfig {}", file.display())),
        (None, None) => {
            let available = available(&merged.contexts);
            let problem =
                format!("no current-context set and no --context given (available: {available})");
            return Err(invalid(merged.label(), problem));
        }
    };
    let (context, context_origin) = find(&merged.contexts, "context", &context_name, &named_in)?;

    let Some(cluster_name) = set(&context.value.cluster) else {
        return Err(invalid(context_origin, "no cluster set"));
    };
    let (cluster, cluster_origin) =
        find(&merged.clusters, "cluster", cluster_name, &context_origin)?;
    let (file, cluster) = (&cluster.file, &cluster.value);

    let server = cluster.server.as_deref().unwrap_or_default();
    if server.trim().is_empty() {
        return Err(invalid(cluster_origin, "no server set"));
    }
    let server = normalize_server(server).map_err(|p| invalid(&cluster_origin, p))?;
    let insecure = cluster.insecure_skip_tls_verify.unwrap_or(false);
    let ca = pem_from_data_or_file(
        &cluster_origin,
        file,
        "certificate-authority",
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
    )?;
    if insecure && ca.is_some() {
        // The same refusal as client-go's transport: it is unclear which one was meant.
        let problem = "certificate-authority and insecure-skip-tls-verify cannot both be set";
        return Err(invalid(cluster_origin, problem));
    }
    let server_name = set(&cluster.tls_server_name);

    let (credentials, client) = if let Some(user_name) = set(&context.value.user) {
        let (user, user_origin) = find(&merged.users, "user", user_name, &context_origin)?;
        let ca = ca.as_ref().map(|(pem, _)| pem.as_slice());
        let cluster_info = exec_cluster_info(&server, cluster, ca);
        user_credentials(&user_origin, &user.file, &user.value, &cluster_info)?
    } else {
        // A context without a user is anonymous access; kubectl allows it.
        (Credentials::anonymous(), None)
    };

    let settings = TlsSettings {
        ca,
        insecure,
        server_name: server_name.map(|n| (n.into(), format!("{cluster_origin}, tls-server-name"))),
        client,
    };
    let file = context.file.display();
    let source = format!("kubeconfig {file}, context {context_name}");
    let namespace = set(&context.value.namespace).map(String::from);
    let proxy = set(&cluster.proxy_url).map(|url| proxy::from_kubeconfig(url, &cluster_origin));
    let proxy = proxy.transpose()?;
    let mut config = finish(server, namespace, source, credentials, settings)?;
    config.proxy = proxy;
    Ok(config)
}

/// The entry `name` and where it is defined, or an error at `origin` listing the names there are.
fn find<'a, T>(
    entries: &'a BTreeMap<String, Defined<T>>,
    kind: &str,
    name: &str,
    origin: &str,
) -> Result<(&'a Defined<T>, String), ConfigError> {
    let Some(entry) = entries.get(name) else {
        let available = available(entries);
        let problem = format!("{kind} {name:?} not found (available: {available})");
        return Err(invalid(origin, problem));
    };
    let defined_at = format!("kubeconfig {}, {kind} {name:?}", entry.file.display());
    Ok((entry, defined_at))
}

fn available<T>(entries: &BTreeMap<String, T>) -> String {
    match entries.is_empty() {
        true => "none".to_string(),
        false => entries.keys().cloned().collect::<Vec<_>>().join(", "),
    }
}

/// The ExecCredential's `spec.cluster`, for plugins with `provideClusterInfo: true`.
fn exec_cluster_info(server: &str, cluster: &RawCluster, ca: Option<&[u8]>) -> serde_json::Value {
    let mut info = serde_json::json!({ "server": server });
    if let Some(name) = set(&cluster.tls_server_name) {
        info["tls-server-name"] = name.into();
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        info["insecure-skip-tls-verify"] = true.into();
    }
    if let Some(ca) = ca {
        info["certificate-authority-data"] = base64_encode(ca).into();
    }
    // Per-cluster plugin settings live in the extension named for the exec API group.
    let mut extensions = cluster.extensions.iter().flatten();
    let exec = extensions.find(|e| e.name == "client.authentication.k8s.io/exec");
    let settings = exec.and_then(|e| e.extension.as_ref());
    if let Some(config) = settings.and_then(|v| serde_json::to_value(v).ok()) {
        info["config"] = config;
    }
    info
}

fn user_credentials(
    origin: &str,
    file: &Path,
    user: &RawUser,
    cluster_info: &serde_json::Value,
) -> Result<(Credentials, Option<ClientPair>), ConfigError> {
    if let Some(provider) = &user.auth_provider {
        let name = provider.name.as_deref().unwrap_or("");
        return Err(invalid(
            origin,
            format!("auth-provider {name:?} is not supported (it was removed from kubectl); configure an exec credential plugin instead"),
        ));
    }
    if user.username.is_some() || user.password.is_some() {
        return Err(invalid(
            origin,
            "username/password (basic auth) is not supported; use a token, client certificate or exec plugin",
        ));
    }
    if user.impersonate.is_some() {
        return Err(invalid(origin, "impersonation (as) is not supported"));
    }

    let cert = pem_from_data_or_file(
        origin,
        file,
        "client-certificate",
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
    )?;
    let key = pem_from_data_or_file(
        origin,
        file,
        "client-key",
        user.client_key_data.as_deref(),
        user.client_key.as_deref(),
    )?;
    let client = match (cert, key) {
        (Some((cert, cert_origin)), Some((key, key_origin))) => Some(ClientPair {
            cert,
            cert_origin,
            key,
            key_origin,
        }),
        (None, None) => None,
        (cert, _) => {
            let (set, unset) = match cert {
                Some(_) => ("client-certificate", "client-key"),
                None => ("client-key", "client-certificate"),
            };
            return Err(invalid(origin, format!("{set} is set but {unset} is not")));
        }
    };

    // As in client-go, a token file wins over a token, and a token over an exec plugin.
    let credentials = if let Some(token_file) = set(&user.token_file) {
        Credentials::token_file(resolve(file, token_file), format!("{origin}, tokenFile"))?
    } else if let Some(token) = set(&user.token) {
        Credentials::token(token.trim().to_string())
    } else if let Some(exec) = &user.exec {
        Credentials::exec(exec_config(origin, file, exec, cluster_info)?)?
    } else {
        Credentials::anonymous()
    };
    Ok((credentials, client))
}

fn exec_config(
    origin: &str,
    file: &Path,
    exec: &RawExec,
    cluster_info: &serde_json::Value,
) -> Result<ExecConfig, ConfigError> {
    let origin = format!("{origin}, exec");
    let command = exec.command.as_deref().unwrap_or_default();
    if command.is_empty() {
        return Err(invalid(origin, "no command set"));
    }
    // As in client-go, a path is relative to the kubeconfig's directory, a bare name in PATH.
    let command = if command.contains('/') {
        resolve(file, command).into_os_string()
    } else {
        command.into()
    };
    let env = exec.env.iter().flatten();
    Ok(ExecConfig {
        origin,
        command,
        args: exec.args.clone().unwrap_or_default(),
        env: env
            .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
            .collect(),
        api_version: exec.api_version.clone().unwrap_or_default(),
        install_hint: set(&exec.install_hint).map(String::from),
        interactive_mode: set(&exec.interactive_mode).map(String::from),
        cluster: (exec.provide_cluster_info == Some(true)).then(|| cluster_info.clone()),
    })
}

/// A field's value, if it is set: kubectl treats an empty one as unset.
fn set(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|s| !s.is_empty())
}

/// PEM from `FIELD-data`, which wins as in client-go, or the file `FIELD`, and its origin.
fn pem_from_data_or_file(
    origin: &str,
    file: &Path,
    field: &str,
    data: Option<&str>,
    path: Option<&str>,
) -> Result<Option<(Vec<u8>, String)>, ConfigError> {
    if let Some(data) = data.filter(|d| !d.trim().is_empty()) {
        let origin = format!("{origin}, {field}-data");
        let pem = base64_decode(data).map_err(|problem| invalid(&origin, problem))?;
        return Ok(Some((pem, origin)));
    }
    if let Some(path) = path.filter(|p| !p.is_empty()) {
        let path = resolve(file, path);
        let what = format!("{origin}, {field}");
        let pem = read_file(&path, &what)?;
        return Ok(Some((pem, format!("{what} {}", path.display()))));
    }
    Ok(None)
}

/// Standard base64 taking stray low bits in the last character, as Go's `encoding/base64`.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// Decodes a `*-data` field, whitespace ignored; errors name an offset, never the content.
pub(super) fn base64_decode(input: &str) -> Result<Vec<u8>, String> {
    let is_data = |(_, b): &(usize, u8)| !matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    // Every byte that is not whitespace, with its offset in `input`.
    let kept: Vec<(usize, u8)> = input.bytes().enumerate().filter(is_data).collect();
    let offset = |i: usize| kept.get(i).map_or(input.len(), |&(o, _)| o);
    let data: Vec<u8> = kept.iter().map(|&(_, b)| b).collect();
    let data_len = data.iter().position(|&b| b == b'=').unwrap_or(data.len());
    if let Some(i) = data[data_len..].iter().position(|&b| b != b'=') {
        let at = offset(data_len + i);
        return Err(format!("invalid base64: data after padding at offset {at}"));
    }
    let truncated = || "invalid base64: truncated input".to_string();
    if data.len() - data_len > 2 {
        return Err(truncated());
    }
    LENIENT.decode(&data[..data_len]).map_err(|e| match e {
        DecodeError::InvalidByte(i, _) => {
            let at = offset(i);
            format!("invalid base64: unexpected character at offset {at}")
        }
        _ => truncated(),
    })
}

pub(super) fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        error,
    })
}

/// A path from a kubeconfig, relative to the file's directory (client-go's `ResolvePaths`).
fn resolve(kubeconfig: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    // Dropping "." components keeps "./bin/plugin" readable in messages.
    let relative: PathBuf = path
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect();
    kubeconfig.parent().unwrap_or(Path::new("")).join(relative)
}

/// `https://host:port[/prefix]` without a trailing slash, read as client-go's
/// `rest.DefaultServerURL` reads it: without `scheme://` a bare `host[:port]` for https, with no
/// path. What client-go's transport would refuse at every request is refused here, at start.
fn normalize_server(server: &str) -> Result<String, String> {
    let server = server.trim();
    // A scheme as Go's url.Parse reads one, followed by a host.
    let scheme_end = server.find("://").filter(|&i| {
        let (s, rest) = (&server.as_bytes()[..i], &server[i + 3..]);
        s.first().is_some_and(u8::is_ascii_alphabetic)
            && s.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c))
            && !rest.starts_with(['/', '?', '#'])
            && !rest.is_empty()
    });
    let (scheme, rest, bare) = match scheme_end {
        // Go's url.Parse lowercases the scheme.
        Some(i) => (server[..i].to_ascii_lowercase(), &server[i + 3..], false),
        None => ("https".to_string(), server, true),
    };
    if scheme != "https" && scheme != "http" {
        return Err(format!(
            "server {server:?} is not an http:// or https:// URL"
        ));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if let Some((_, host)) = authority.rsplit_once('@') {
        // Go would send them as Basic auth, which kube-apiserver refuses; kept, we'd log them.
        return Err(format!(
            "server {scheme}://xxxxx@{host}{path} carries a user name or password, which the operator \
             neither sends nor prints: give the credentials in users[].user"
        ));
    }
    let url = format!("{scheme}://{rest}");
    if authority.is_empty() || authority.starts_with(':') {
        return Err(format!("server {server:?} is not a valid URL: no host"));
    }
    if bare && !(path.is_empty() || path == "/") {
        return Err(format!(
            "server {server:?} is not a valid URL: want https://HOST[:PORT][/PATH] or HOST[:PORT]"
        ));
    }
    // http::Uri takes any digits as a port; a colon inside brackets is an IPv6 address's.
    let port = authority.rsplit_once(':').map_or("", |(_, p)| p);
    let bad_port = !port.is_empty() && !port.ends_with(']') && port.parse::<u16>().is_err();
    // Parsed now, as every request's URL is, so that a typo fails at start.
    let why = match url.parse::<ureq::http::Uri>() {
        Err(e) => e.to_string(),
        Ok(_) if bad_port => "invalid port".to_string(),
        Ok(_) => return Ok(url.trim_end_matches('/').to_string()),
    };
    Err(format!("server {server:?} is not a valid URL: {why}"))
}
