//! Command line: raw flags as clap parses them ([`Args`]), checked into a [`Config`].

use crate::kube::config::LoadOptions;
use crate::runtime::{leader, logging, serve};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

const ABOUT: &str = "Keeps exactly one pod running for every ImmortalContainer.";
const LONG_ABOUT: &str = "\
Keeps exactly one pod running for every ImmortalContainer (immortalcontainer.flugel.it/v1alpha1).

For an object NAME it keeps the pod NAME-immortalpod, running spec.image in a container called
acontainer, and creates a new one whenever that pod is deleted or terminates. status.currentPod
names the pod; status.startTimes counts the pods started for the object.

Cluster access, first match wins: --kubeconfig, $KUBECONFIG, ~/.kube/config, then the in-cluster
service account. Logs go to stderr; the level comes from RUST_LOG (default info).";

const AFTER_HELP: &str = "\
Examples:
  immortal-operator --kubeconfig ~/.kube/config
  RUST_LOG=debug immortal-operator --namespace demo --log-format json 2> operator.log
  immortal-operator --namespace team-a,team-b --namespace team-c
  immortal-operator trace demo/web --log operator.log";

const TRACE_EXIT_CODES: &str = "\
Exit codes: 0 the timeline was printed; 1 no log line is about the object; 2 bad arguments;
3 the log file cannot be read.";

#[derive(Debug, Parser)]
#[command(name = "immortal-operator", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Kubeconfig file to use (overrides $KUBECONFIG and ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use instead of the current one.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// Serve ImmortalContainers in these namespaces only: a comma-separated list, or the flag
    /// repeated (default: all namespaces).
    #[arg(long, short = 'n', value_name = "NS[,NS...]", action = clap::ArgAction::Append)]
    pub namespace: Vec<String>,

    /// Log line format.
    #[arg(long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub log_format: logging::Format,

    /// Reconcile threads at rest. Never two on the same object.
    #[arg(long, default_value_t = DEFAULT_WORKERS, value_name = "N")]
    pub workers: usize,

    /// Reconcile threads at most: more start while objects wait for one, and end after 10s
    /// idle [default: 40, or --workers if more].
    #[arg(long, value_name = "N")]
    pub max_workers: Option<usize>,

    /// Elect a leader among replicas through a Lease; only the leader writes.
    #[arg(long)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease (default: $POD_NAMESPACE, then the kubeconfig or
    /// service-account namespace).
    #[arg(long, value_name = "NS")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader-election Lease.
    #[arg(long, default_value = "immortal-operator", value_name = "NAME")]
    pub leader_election_id: String,

    /// How long a Lease stays valid without renewal (e.g. 15s, 1m30s).
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up and exits.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub renew_deadline: Duration,

    /// How often to try to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub retry_period: Duration,

    /// Address of the Prometheus /metrics endpoint (":8443" = all interfaces, IPv4 and IPv6;
    /// "0" disables).
    #[arg(long, default_value = ":8443", value_name = "ADDR")]
    pub metrics_bind_address: String,

    /// Serve /metrics over HTTPS to callers the API server authenticates (TokenReview) and
    /// authorizes for GET /metrics (SubjectAccessReview); "--metrics-secure=false" serves plain
    /// HTTP to anyone, for local runs.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_name = "BOOL", action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// Directory with the metrics certificate, tls.crt and tls.key (a mounted kubernetes.io/tls
    /// Secret); without it a self-signed certificate is made at start.
    #[arg(long, value_name = "DIR")]
    pub metrics_cert_path: Option<PathBuf>,

    /// Address of the /healthz and /readyz probes, plain HTTP (":8081" = all interfaces, IPv4
    /// and IPv6; "0" disables).
    #[arg(long, default_value = ":8081", value_name = "ADDR")]
    pub health_probe_bind_address: String,

    /// Give a watch up as dead after this long without a word from the API server, and
    /// resume it (the server sends a bookmark about once a minute); /readyz fails once a watch
    /// has not been live for longer than this.
    #[arg(long, default_value = "75s", value_parser = parse_duration, value_name = "DURATION")]
    pub watch_idle_timeout: Duration,

    /// List everything again and reconcile every object this often, as a safety net for
    /// anything no event announced ("0" disables). Each relist is drawn from 90-110 % of it.
    #[arg(long, default_value = "10h", value_parser = parse_duration, value_name = "DURATION")]
    pub relist_period: Duration,

    /// Deprecated for --relist-period: a client-go resync sends no request, where this lists.
    #[arg(long, hide = true, value_parser = parse_duration, value_name = "DURATION")]
    pub resync_period: Option<Duration>,

    /// The flags the command line set, as opposed to left at their defaults.
    #[arg(skip)]
    pub given: Vec<String>,
}

/// The flags that only mean something with `--leader-elect`.
const LEADER_FLAGS: [&str; 5] = [
    "--leader-election-namespace",
    "--leader-election-id",
    "--lease-duration",
    "--renew-deadline",
    "--retry-period",
];

impl Args {
    /// Parses `argv` like [`Parser::try_parse_from`], and notes in [`Args::given`] which flags
    /// the command line set: the values cannot tell a default given from one left out.
    pub fn try_parse_given(
        argv: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
    ) -> Result<Args, clap::Error> {
        let matches = Args::command().try_get_matches_from(argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        args.given = Args::command()
            .get_arguments()
            .filter(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        Ok(args)
    }

    /// Refuses operator flags before `trace`, which reads a log: they would do nothing.
    pub fn check(&self) -> Result<(), InvalidFlags> {
        match (&self.command, self.given.first()) {
            (Some(Command::Trace(_)), Some(flag)) => Err(InvalidFlags(format!(
                "{flag} is an operator flag; trace takes only NAMESPACE/NAME and --log FILE"
            ))),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print one object's reconciliation history from the operator's logs (text or JSON).
    #[command(after_help = TRACE_EXIT_CODES)]
    Trace(TraceArgs),
}

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// The object, as NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME", value_parser = parse_object)]
    pub object: String,
    /// Log file to read, as the operator wrote it, text or JSON (default: standard input).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}

/// `NAMESPACE/NAME`, as every log line names its object: a bare name would match nothing.
fn parse_object(s: &str) -> Result<String, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(s.into())
        }
        _ => {
            let name = s.trim_matches('/').rsplit('/').next().unwrap_or("example");
            Err(format!("want NAMESPACE/NAME, e.g. default/{name}"))
        }
    }
}

/// A duration as Go's flags take it (`15s`, `1m30s`, `500ms`), or plain seconds (`0`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let invalid = |why: &dyn std::fmt::Display| {
        format!("invalid duration {s:?} (e.g. 15s, 1m30s, 500ms): {why}")
    };
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| invalid(&e));
    }
    let d = s.parse::<jiff::SignedDuration>().map_err(|e| invalid(&e))?;
    Duration::try_from(d).map_err(|_| invalid(&"negative"))
}

/// Reconcile threads by default, at rest and at most (docs/benchmark.md, "Workers").
pub const DEFAULT_WORKERS: usize = 16;
pub const DEFAULT_MAX_WORKERS: usize = 40;

/// The namespaces the operator serves.
#[derive(Debug, Clone, PartialEq)]
pub enum Namespaces {
    All,
    /// Each one listed and watched on its own: the API has no watch of a set of namespaces.
    Only(Vec<String>),
}

impl Namespaces {
    /// One entry per watch of each resource: `None` watches every namespace.
    pub fn each(&self) -> Vec<Option<&str>> {
        match self {
            Namespaces::All => vec![None],
            Namespaces::Only(set) => set.iter().map(|ns| Some(ns.as_str())).collect(),
        }
    }

    /// As the `starting` line shows them: `(all)`, or the names joined by commas.
    pub fn shown(&self) -> String {
        match self {
            Namespaces::All => "(all)".into(),
            Namespaces::Only(set) => set.join(","),
        }
    }

    /// `--namespace` as given: comma-separated namespace names, none empty, none twice.
    fn parse(given: &[String]) -> Result<Namespaces, InvalidFlags> {
        if given.is_empty() {
            return Ok(Namespaces::All);
        }
        let mut set: Vec<String> = Vec::new();
        for value in given {
            for ns in value.split(',') {
                ensure(!ns.is_empty(), || {
                    format!("--namespace {value:?} has an empty entry (want NS or NS,NS,...)")
                })?;
                ensure(is_namespace_name(ns), || {
                    format!(
                        "--namespace: {ns:?} is not a namespace name (lowercase letters, digits \
                         and '-', starting and ending with a letter or digit, at most 63)"
                    )
                })?;
                ensure(!set.iter().any(|s| s == ns), || {
                    format!("--namespace names {ns:?} twice")
                })?;
                set.push(ns.to_string());
            }
        }
        Ok(Namespaces::Only(set))
    }
}

/// A DNS-1123 label, what Kubernetes takes as a namespace's name.
fn is_namespace_name(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub cluster: LoadOptions,
    pub namespaces: Namespaces,
    pub log_format: logging::Format,
    pub workers: usize,
    /// Never below `workers`.
    pub max_workers: usize,
    /// With `--leader-elect`; an empty namespace is the cluster's default, known once connected.
    pub leader: Option<leader::Settings>,
    pub endpoints: serve::Settings,
    pub watch_idle_timeout: Duration,
    /// `None` when disabled.
    pub relist_period: Option<Duration>,
    /// What the command line asked in words that are going away, for one WARN each at start.
    pub deprecated: Vec<&'static str>,
}

/// A flag combination that cannot run.
#[derive(Debug, PartialEq)]
pub struct InvalidFlags(pub String);

impl fmt::Display for InvalidFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), InvalidFlags> {
    ok.then_some(()).ok_or_else(|| InvalidFlags(why()))
}

impl TryFrom<Args> for Config {
    type Error = InvalidFlags;

    fn try_from(a: Args) -> Result<Config, InvalidFlags> {
        let workers = a.workers;
        ensure((1..=256).contains(&workers), || {
            format!("--workers must be between 1 and 256, got {workers}")
        })?;
        let max_workers = a.max_workers.unwrap_or(DEFAULT_MAX_WORKERS.max(workers));
        ensure((workers..=256).contains(&max_workers), || {
            format!(
                "--max-workers must be between --workers ({workers}) and 256, got {max_workers}"
            )
        })?;
        let namespaces = Namespaces::parse(&a.namespace)?;
        let leader_flag = a.given.iter().find(|f| LEADER_FLAGS.contains(&f.as_str()));
        if let (false, Some(flag)) = (a.leader_elect, leader_flag) {
            return Err(InvalidFlags(format!(
                "{flag} needs --leader-elect (without it there is no leader election to tune)"
            )));
        }
        let leader = if a.leader_elect {
            let (lease, renew, retry) = (a.lease_duration, a.renew_deadline, a.retry_period);
            ensure(renew < lease, || {
                format!("--renew-deadline ({renew:?}) must be shorter than --lease-duration ({lease:?})")
            })?;
            ensure(retry < renew && !retry.is_zero(), || {
                format!("--retry-period ({retry:?}) must be positive and shorter than --renew-deadline ({renew:?})")
            })?;
            ensure(lease >= Duration::from_secs(1), || {
                "--lease-duration must be at least 1s".into()
            })?;
            Some(leader::Settings {
                namespace: a
                    .leader_election_namespace
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_default(),
                name: a.leader_election_id,
                identity: leader::identity(),
                lease_duration: lease,
                renew_deadline: renew,
                retry_period: retry,
            })
        } else {
            None
        };
        let metrics = serve::parse_bind(&a.metrics_bind_address)
            .map_err(|e| InvalidFlags(format!("--metrics-bind-address: {e}")))?;
        let probes = serve::parse_bind(&a.health_probe_bind_address)
            .map_err(|e| InvalidFlags(format!("--health-probe-bind-address: {e}")))?;
        // Shorter would give up a healthy watch between two events of a busy one.
        let idle = a.watch_idle_timeout;
        ensure(idle >= Duration::from_secs(1), || {
            format!("--watch-idle-timeout must be at least 1s, got {idle:?}")
        })?;
        let given = |flag: &str| a.given.iter().any(|f| f == flag);
        ensure(
            !(given("--relist-period") && given("--resync-period")),
            || {
                "--resync-period is the deprecated name of --relist-period: give only --relist-period"
                .into()
            },
        )?;
        let (relist, relist_flag, deprecated) = match a.resync_period {
            Some(p) => (
                p,
                "--resync-period",
                vec!["--resync-period is deprecated: use --relist-period"],
            ),
            None => (a.relist_period, "--relist-period", vec![]),
        };
        // Every relist lists every object and reconciles it: more often is a load.
        ensure(
            relist.is_zero() || relist >= Duration::from_secs(60),
            || format!("{relist_flag} must be 0 (off) or at least 1m, got {relist:?}"),
        )?;
        // A certificate for a plain-HTTP endpoint is a mistake worth saying, not ignoring.
        ensure(a.metrics_secure || a.metrics_cert_path.is_none(), || {
            "--metrics-cert-path needs --metrics-secure (it is for HTTPS)".into()
        })?;
        Ok(Config {
            cluster: LoadOptions {
                kubeconfig: a.kubeconfig,
                context: a.context,
            },
            namespaces,
            log_format: a.log_format,
            workers: a.workers,
            max_workers,
            leader,
            endpoints: serve::Settings {
                metrics,
                probes,
                secure: a.metrics_secure,
                cert_dir: a.metrics_cert_path,
            },
            watch_idle_timeout: idle,
            relist_period: Some(relist).filter(|p| !p.is_zero()),
            deprecated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let a =
            Args::try_parse_given(std::iter::once("immortal-operator").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        a.check().map_err(|e| e.0)?;
        Config::try_from(a).map_err(|e| e.0)
    }

    #[test]
    fn leader_election_flags_without_leader_elect_are_refused() {
        for flag in LEADER_FLAGS {
            let value = if flag.ends_with("-namespace") || flag.ends_with("-id") {
                "x"
            } else {
                "5s"
            };
            let e = parse(&[flag, value]).unwrap_err();
            assert!(e.contains(flag) && e.contains("--leader-elect"), "{e}");
        }
        // Given with their default values, too: the user meant something by them.
        let e = parse(&["--lease-duration", "15s"]).unwrap_err();
        assert!(e.contains("--lease-duration"), "{e}");
        let c = parse(&["--leader-elect", "--leader-election-id", "x"]).unwrap();
        assert_eq!(c.leader.unwrap().name, "x");
    }

    #[test]
    fn operator_flags_before_trace_are_refused() {
        let check = |args: &[&str]| {
            Args::try_parse_given(["immortal-operator"].iter().chain(args))
                .unwrap()
                .check()
                .map_err(|e| e.0)
        };
        assert!(check(&["trace", "default/example", "--log", "x.log"]).is_ok());
        let e = check(&["--namespace", "demo", "trace", "default/example"]).unwrap_err();
        assert!(e.contains("--namespace") && e.contains("trace"), "{e}");
        let e = check(&["--log-format", "json", "trace", "default/example"]).unwrap_err();
        assert!(e.contains("--log-format"), "{e}");
    }

    #[test]
    fn defaults_serve_all_namespaces_with_the_default_workers() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.namespaces, Namespaces::All);
        assert_eq!(c.workers, DEFAULT_WORKERS);
        assert!(c.leader.is_none());
        assert_eq!(
            c.watch_idle_timeout,
            crate::runtime::watcher::DEFAULT_IDLE_TIMEOUT
        );
        assert_eq!(
            c.endpoints,
            serve::Settings {
                metrics: Some("[::]:8443".parse().unwrap()),
                probes: Some("[::]:8081".parse().unwrap()),
                secure: true,
                cert_dir: None,
            }
        );
    }

    #[test]
    fn namespaces_come_as_a_list_or_a_repeated_flag_in_the_order_given() {
        let only = |v: &[&str]| Namespaces::Only(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(parse(&["-n", "a"]).unwrap().namespaces, only(&["a"]));
        assert_eq!(
            parse(&["--namespace", "b,a", "--namespace", "c"])
                .unwrap()
                .namespaces,
            only(&["b", "a", "c"])
        );
        assert_eq!(
            parse(&["--namespace=team-1"]).unwrap().namespaces.each(),
            [Some("team-1")]
        );
        assert_eq!(Namespaces::All.each(), [None]);
        assert_eq!(only(&["a", "b"]).shown(), "a,b");
    }

    #[test]
    fn empty_duplicate_and_invalid_namespaces_are_refused_naming_the_flag() {
        for (args, says) in [
            (&["--namespace", ""][..], "empty entry"),
            (&["--namespace", "a,,b"], "empty entry"),
            (&["--namespace", "a,"], "empty entry"),
            (&["--namespace", "a,b", "-n", "a"], "\"a\" twice"),
            (&["--namespace", "Team_A"], "not a namespace name"),
            (&["--namespace=-a"], "not a namespace name"),
            (&["--namespace", "a-"], "not a namespace name"),
            (&["--namespace", "a b"], "not a namespace name"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(
                e.starts_with("--namespace") && e.contains(says),
                "{args:?}: {e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let longest = "a".repeat(63);
        assert!(parse(&["--namespace", &longest]).is_ok());
        assert!(parse(&["--namespace", &format!("{longest}a")]).is_err());
    }

    #[test]
    fn metrics_secure_takes_go_bool_flag_forms() {
        assert!(parse(&["--metrics-secure"]).unwrap().endpoints.secure);
        assert!(parse(&["--metrics-secure=true"]).unwrap().endpoints.secure);
        assert!(!parse(&["--metrics-secure=false"]).unwrap().endpoints.secure);
        // Go's flag package reads `--metrics-secure false` as true plus an argument: refuse it
        // rather than guess.
        assert!(parse(&["--metrics-secure", "false"]).is_err());
        assert!(parse(&["--metrics-secure=maybe"]).is_err());
    }

    #[test]
    fn a_metrics_certificate_for_plain_http_is_refused() {
        let c = parse(&["--metrics-cert-path", "/certs"]).unwrap();
        assert_eq!(c.endpoints.cert_dir, Some(PathBuf::from("/certs")));
        let e = parse(&["--metrics-cert-path", "/certs", "--metrics-secure=false"]).unwrap_err();
        assert!(e.contains("--metrics-cert-path"), "{e}");
    }

    #[test]
    fn durations_parse_like_go_flags() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("-5").is_err());
    }

    #[test]
    fn a_go_style_lease_duration_is_taken() {
        let c = parse(&["--leader-elect", "--lease-duration", "1m30s"]).unwrap();
        assert_eq!(c.leader.unwrap().lease_duration, Duration::from_secs(90));
    }

    #[test]
    fn inconsistent_leader_election_timings_are_refused() {
        let e = parse(&[
            "--leader-elect",
            "--lease-duration",
            "5s",
            "--renew-deadline",
            "10s",
        ])
        .unwrap_err();
        assert!(e.contains("--renew-deadline"), "{e}");
        assert!(parse(&["--leader-elect"]).unwrap().leader.is_some());
    }

    #[test]
    fn the_relist_period_is_ten_hours_off_at_zero_and_never_a_hot_loop() {
        assert_eq!(
            parse(&[]).unwrap().relist_period,
            Some(Duration::from_secs(36_000))
        );
        assert_eq!(
            parse(&["--relist-period", "0"]).unwrap().relist_period,
            None
        );
        assert_eq!(
            parse(&["--relist-period", "30m"]).unwrap().relist_period,
            Some(Duration::from_secs(1800))
        );
        let e = parse(&["--relist-period", "5s"]).unwrap_err();
        assert!(e.contains("--relist-period"), "{e}");
    }

    #[test]
    fn resync_period_still_sets_the_relist_period_said_deprecated_and_hidden() {
        let c = parse(&["--resync-period", "30m"]).unwrap();
        assert_eq!(c.relist_period, Some(Duration::from_secs(1800)));
        assert_eq!(
            c.deprecated,
            ["--resync-period is deprecated: use --relist-period"]
        );
        assert_eq!(
            parse(&["--resync-period", "0"]).unwrap().relist_period,
            None
        );
        assert!(parse(&[]).unwrap().deprecated.is_empty());
        assert!(parse(&["--relist-period", "1h"])
            .unwrap()
            .deprecated
            .is_empty());
        let e = parse(&["--resync-period", "5s"]).unwrap_err();
        assert!(e.contains("--resync-period"), "{e}");
        // Both, even with the same value: which one was meant is the user's to say.
        let e = parse(&["--relist-period", "1h", "--resync-period", "1h"]).unwrap_err();
        assert!(
            e.contains("--relist-period") && e.contains("--resync-period"),
            "{e}"
        );
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("--relist-period"), "{help}");
        assert!(!help.contains("--resync-period"), "{help}");
    }

    #[test]
    fn the_watch_idle_timeout_is_a_duration_of_at_least_a_second() {
        assert_eq!(
            parse(&["--watch-idle-timeout", "3s"])
                .unwrap()
                .watch_idle_timeout,
            Duration::from_secs(3)
        );
        assert!(parse(&["--watch-idle-timeout", "500ms"])
            .unwrap_err()
            .contains("--watch-idle-timeout"));
    }

    #[test]
    fn trace_wants_a_namespace_and_a_name() {
        let object = |args: &[&str]| {
            Args::try_parse_given(["immortal-operator", "trace"].iter().chain(args))
                .map(|a| match a.command {
                    Some(Command::Trace(t)) => t.object,
                    None => unreachable!(),
                })
                .map_err(|e| (e.exit_code(), e.to_string()))
        };
        assert_eq!(object(&["default/example"]).unwrap(), "default/example");
        for bad in ["example", "/example", "default/", "a/b/c"] {
            let (code, msg) = object(&[bad]).unwrap_err();
            assert_eq!(code, 2, "{bad}");
            assert!(msg.contains("want NAMESPACE/NAME"), "{bad}: {msg}");
        }
        assert!(object(&["example"])
            .unwrap_err()
            .1
            .contains("default/example"));
    }

    #[test]
    fn workers_grow_to_40_by_default_and_never_below_what_was_asked() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.workers, c.max_workers), (16, 40));
        assert_eq!(parse(&["--workers", "100"]).unwrap().max_workers, 100);
        assert_eq!(parse(&["--max-workers", "16"]).unwrap().max_workers, 16);
        assert!(parse(&["--workers", "8", "--max-workers", "4"])
            .unwrap_err()
            .contains("--max-workers"));
        assert!(parse(&["--max-workers", "1000"])
            .unwrap_err()
            .contains("--max-workers"));
    }

    #[test]
    fn zero_workers_and_bad_addresses_are_refused() {
        assert!(parse(&["--workers", "0"])
            .unwrap_err()
            .contains("--workers"));
        assert!(parse(&["--metrics-bind-address", "x"])
            .unwrap_err()
            .contains("--metrics-bind-address"));
        assert_eq!(
            parse(&["--metrics-bind-address", "0"])
                .unwrap()
                .endpoints
                .metrics,
            None
        );
    }
}
