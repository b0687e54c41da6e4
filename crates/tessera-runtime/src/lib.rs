//! What every long-running role shares, so that `controller` and `node` each only
//! wire their own parts:
//!
//! ```text
//!  init_tracing(&LogArgs)             logs on stderr (--log-level, --log-format; RUST_LOG wins)
//!  connect(&ApiRequests) ─▶ Client    the in-cluster or KUBECONFIG client, every
//!                                     request counted (requests::CountRequests)
//!  start_metrics(addr, Metrics) ─▶ Arc<Metrics>  /metrics, /healthz, /readyz served
//!  Shutdown::listen() ─▶ Shutdown      SIGINT or SIGTERM, cloned by every part that stops
//!  csi::spawn(endpoint, services, routes, shutdown)   a CSI socket served until shutdown
//!  recorder::Recorders                 Event recorders, each object's Events through one
//! ```
//!
//! and how errors are written down: [`error_chain`] prints one with its causes,
//! [`is_not_found`] tells an object already gone (logged at debug, not as a warning),
//! [`KubeError`] (built with [`KubeContext::context`]) names the API call that
//! failed (what an error echoes of a request is bounded by `tessera_text::truncated`).
//!
//! | module | owns |
//! |---|---|
//! | [`metrics`] | the Prometheus families and the `/metrics`, `/healthz`, `/readyz` endpoint |
//! | [`requests`] | every request of the API client counted, at the HTTP layer |
//! | [`recorder`] | kube-runtime's Event recorder, in shards |
//! | [`csi`] | serving CSI on a unix socket until shutdown |
//! | [`backoff`] | how the API watches of every role retry |
//! | [`spacing`] | how often one writer may write one VolumeAttachment |
//! | [`labels`] | equality label selectors from the command line |
//! | this one | tracing, the API client, signals, error chains |
//!
//! This module imports nothing of ours but [`crate::metrics`]: every other module may
//! use it.

pub mod backoff;
pub mod csi;
pub mod labels;
pub mod metrics;
pub mod recorder;
pub mod requests;
pub mod spacing;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::metrics::{ApiRequests, Metrics};

/// An error and its sources, `outer: inner: innermost`, for one log line: printed
/// once, where the error is handled.
///
/// A source that its error's message already ends with is not repeated, and a
/// `kube::Error::Api` link is left out: it prints its status twice, once with
/// `Debug`, and its source, the status itself, follows anyway.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        cur = c.source();
        if matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(_))) && cur.is_some() {
            continue;
        }
        let text = c.to_string();
        // Some errors already print their source in their own message: say it once.
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
    }
    s
}

/// Whether the API server answered 404 Not Found anywhere in `e`'s chain: the object
/// the call named is not there. For an object Tessera deletes, or writes as it goes
/// away (a MountPod whose finalizer was just removed, a deleted Volume's
/// VolumeAttachment), that is done, not a failure: callers log such an error at debug,
/// never as a warning, which is for what an operator should look at.
pub fn is_not_found(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(kube::Error::Api(s)) = c.downcast_ref::<kube::Error>()
            && s.code == 404
        {
            return true;
        }
        cur = c.source();
    }
    false
}

/// A call to the API server that failed, and what it was for.
#[derive(Debug, thiserror::Error)]
#[error("{action}")]
pub struct KubeError {
    /// What was being done (`reading Volume pvc-1`).
    pub action: String,
    /// The cause.
    #[source]
    pub source: kube::Error,
}

/// Attach a description of the action to a kube error.
pub trait KubeContext<T> {
    /// `Err(e)` becomes a [`KubeError`] saying what was being done.
    fn context(self, action: impl FnOnce() -> String) -> Result<T, KubeError>;
}

impl<T> KubeContext<T> for Result<T, kube::Error> {
    fn context(self, action: impl FnOnce() -> String) -> Result<T, KubeError> {
        self.map_err(|source| KubeError {
            action: action(),
            source,
        })
    }
}

/// Errors of starting a role's shared parts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No client configuration (neither in-cluster nor a kubeconfig).
    #[error("finding the Kubernetes API server: {0}")]
    Config(String),
    /// The client could not be built.
    #[error("connecting to Kubernetes")]
    Connect(#[source] kube::Error),
    /// The API server did not answer.
    #[error("cannot reach the Kubernetes API server at {url}")]
    Unreachable {
        /// The server's URL.
        url: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The metrics endpoint could not start.
    #[error("serving metrics on {addr}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// SIGINT or SIGTERM could not be listened for.
    #[error("listening for signals")]
    Signals(#[source] std::io::Error),
    /// The CSI socket could not be served.
    #[error(transparent)]
    Csi(#[from] csi::ServeError),
}

/// How logs are written: the flags every role takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log level: error, warn, info, debug or trace, or a filter such as
    /// `info,tessera_controller=debug`. `RUST_LOG`, when set, wins.
    #[arg(long, global = true, env = "TESSERA_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: `text` (colour only on a terminal) or `json` (one object a line).
    #[arg(long, global = true, env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The format of log lines.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// JSON lines.
    Json,
}

/// The filter directives of [`LogArgs`]: `RUST_LOG` when set (and valid), else
/// `--log-level` (or `info` if that is not valid). kube's client logs every failed
/// request at ERROR before returning it, and we print the returned error once where it
/// is handled: that line is left out unless the filter names kube itself.
fn log_directives(args: &LogArgs, rust_log: Option<&str>) -> String {
    use tracing_subscriber::EnvFilter;
    if let Some(env) = rust_log.filter(|s| !s.trim().is_empty())
        && EnvFilter::try_new(env).is_ok()
    {
        return env.to_string();
    }
    let level = if EnvFilter::try_new(&args.log_level).is_ok() {
        args.log_level.as_str()
    } else {
        "info"
    };
    if level.contains("kube") {
        level.to_string()
    } else {
        format!("{level},kube_client::client::builder=off")
    }
}

/// Structured logs on stderr as `args` say; colour only when stderr is a terminal.
/// Does nothing if a subscriber is installed already.
pub fn init_tracing(args: &LogArgs) {
    use std::io::IsTerminal;
    let directives = log_directives(args, std::env::var("RUST_LOG").ok().as_deref());
    let filter = tracing_subscriber::EnvFilter::new(directives);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match args.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The API client: in-cluster configuration, or `KUBECONFIG`, counting every request
/// it sends in `requests`. The API server is asked for its version once, so an
/// unreachable one is one error naming its URL.
pub async fn connect(requests: &ApiRequests) -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let url = config.cluster_url.to_string();
    let client = counted_client(config, requests).map_err(Error::Connect)?;
    client
        .apiserver_version()
        .await
        .map_err(|source| Error::Unreachable {
            url: url.clone(),
            source,
        })?;
    info!(api_server = %url, "connected");
    Ok(client)
}

/// A client for `config` whose every request is counted in `requests` (see
/// [`requests`]).
pub fn counted_client(
    config: kube::Config,
    requests: &ApiRequests,
) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&requests::CountRequests::new(requests.clone()))
        .build())
}

/// New metrics, served on `addr` (`/metrics`, `/healthz`, `/readyz`; not ready until
/// the role says so with [`Metrics::set_ready`]).
pub async fn start_metrics(addr: SocketAddr, metrics: Metrics) -> Result<Arc<Metrics>, Error> {
    let metrics = Arc::new(metrics);
    let bound = crate::metrics::serve(addr, metrics.clone())
        .await
        .map_err(|source| Error::Metrics { addr, source })?;
    info!(addr = %bound, "metrics endpoint listening");
    Ok(metrics)
}

/// A signal that stops a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (what Kubernetes sends a container to stop it).
    Terminate,
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        })
    }
}

/// The request to stop: the first SIGINT or SIGTERM. Clones share it, so every part
/// of a role (the CSI server, the main loop) sees the same signal.
#[derive(Clone, Debug)]
pub struct Shutdown(tokio::sync::watch::Receiver<Option<Signal>>);

impl Shutdown {
    /// Listen for SIGINT and SIGTERM from now on (inside the tokio runtime). From
    /// here, neither signal ends the process by itself: the role stops when it sees
    /// [`Shutdown::requested`].
    pub fn listen() -> Result<Shutdown, Error> {
        let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signals)?;
        let (tx, rx) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            let got = tokio::select! {
                _ = interrupt.recv() => Signal::Interrupt,
                _ = terminate.recv() => Signal::Terminate,
            };
            let _ = tx.send(Some(got));
        });
        Ok(Shutdown(rx))
    }

    /// Wait for the signal.
    pub async fn requested(mut self) -> Signal {
        let got = self.0.wait_for(Option::is_some).await.map(|s| *s);
        match got {
            Ok(signal) => signal.expect("waited for Some"),
            // The listener is gone without a signal: none will come.
            Err(_) => std::future::pending().await,
        }
    }

    /// Run `work` until it ends (`Ok`) or a signal asks to stop (`Err` with the
    /// signal; `work` is dropped).
    pub async fn run_until<T>(&self, work: impl Future<Output = T>) -> Result<T, Signal> {
        tokio::select! {
            done = work => Ok(done),
            signal = self.clone().requested() => Err(signal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}")]
    struct Outer(&'static str, #[source] std::io::Error);

    #[test]
    fn chain_names_every_cause_once() {
        let e = Outer("x", std::io::Error::other("denied"));
        assert_eq!(error_chain(&e), "reading x: denied");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("request failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let e = Outer(
            "x",
            std::io::Error::other(Repeats(std::io::Error::other("denied"))),
        );
        assert_eq!(error_chain(&e), "reading x: request failed: denied");
    }

    #[test]
    fn the_log_filter_is_rust_log_then_the_flag_then_info_without_kubes_duplicate() {
        let args = |level: &str| LogArgs {
            log_level: level.into(),
            log_format: LogFormat::Text,
        };
        let quiet = ",kube_client::client::builder=off";
        for (level, rust_log, want) in [
            ("debug", None, format!("debug{quiet}")),
            ("debug", Some("warn"), "warn".into()),
            ("debug", Some(""), format!("debug{quiet}")),
            ("debug", Some("=bad=filter="), format!("debug{quiet}")),
            (
                "info,tessera=trace",
                None,
                format!("info,tessera=trace{quiet}"),
            ),
            ("debug,kube=trace", None, "debug,kube=trace".into()),
        ] {
            assert_eq!(
                log_directives(&args(level), rust_log),
                want,
                "{level} {rust_log:?}"
            );
        }
    }

    #[test]
    fn an_api_error_is_shown_once_by_its_status() {
        let status =
            kube::core::Status::failure("volumes \"v\" not found", "NotFound").with_code(404);
        let res: Result<(), _> = Err(kube::Error::Api(Box::new(status)));
        let e = res.context(|| "reading Volume v".into()).unwrap_err();
        assert_eq!(
            error_chain(&e),
            "reading Volume v: volumes \"v\" not found: NotFound"
        );
        // On its own, the API error is still printed.
        assert!(error_chain(&e.source).contains("not found"));
    }

    #[test]
    fn not_found_is_told_apart_anywhere_in_the_chain() {
        let api = |code: u16| {
            let status = kube::core::Status::failure("x", "Reason").with_code(code);
            Err::<(), _>(kube::Error::Api(Box::new(status)))
        };
        let gone = api(404).context(|| "writing the status of MountPod m".into());
        let gone = gone.unwrap_err();
        assert!(is_not_found(&gone));
        assert!(is_not_found(&gone.source));
        // Wrapped once more, as the roles' own error enums wrap it.
        #[derive(Debug, thiserror::Error)]
        enum Role {
            #[error(transparent)]
            Kube(#[from] KubeError),
        }
        assert!(is_not_found(&Role::Kube(gone)));
        for code in [409, 410, 422, 500] {
            let e = api(code).context(|| "x".into()).unwrap_err();
            assert!(!is_not_found(&e), "{code}");
        }
        let other: Result<(), kube::Error> = Err(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert!(!is_not_found(&other.context(|| "x".into()).unwrap_err()));
        assert!(!is_not_found(&std::io::Error::other("not found")));
    }

    #[test]
    fn a_kube_error_names_its_action_then_its_cause() {
        let res: Result<(), kube::Error> = Err(kube::Error::LinesCodecMaxLineLengthExceeded);
        let e = res.context(|| "reading Volume v".into()).unwrap_err();
        assert!(
            error_chain(&e).starts_with("reading Volume v: "),
            "{}",
            error_chain(&e)
        );
    }

    #[tokio::test]
    async fn a_signal_stops_the_work_and_is_named() {
        let shutdown = Shutdown::listen().unwrap();
        assert_eq!(shutdown.run_until(async { 7 }).await, Ok(7));
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
        let res = shutdown.run_until(std::future::pending::<()>()).await;
        assert_eq!(res, Err(Signal::Terminate));
        // Every clone sees it, also after the fact.
        assert_eq!(shutdown.clone().requested().await, Signal::Terminate);
    }
}
