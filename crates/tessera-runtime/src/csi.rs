//! Serving CSI on a unix socket: a role hands over the endpoint, the gRPC services
//! (`tonic` [`Routes`]: Identity plus Controller or Node, assembled by
//! [`tessera_csi`]) and its [`Shutdown`]; the socket is bound at once (so a bad
//! endpoint stops the role before it starts) and served on a task of its own until
//! the shutdown.

use std::path::{Path, PathBuf};

use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tracing::{error, info};

use super::{Shutdown, error_chain};

/// Errors of serving CSI.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path is taken by something that is not a socket.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// Binding or serving failed.
    #[error("serving CSI on {path}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server on {0}")]
    Transport(PathBuf, #[source] tonic::transport::Error),
}

/// Parse a CSI endpoint (`unix:///abs/path` or a bare absolute path) into a path.
pub fn endpoint_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

/// Bind a unix socket at `path`, removing a stale socket (and only a socket) first.
pub fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let io = |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(io)?,
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    tokio::net::UnixListener::bind(path).map_err(io)
}

/// Serve `routes` on `listener` (bound at `path`) until `shutdown`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    path: &Path,
    routes: Routes,
    shutdown: Shutdown,
) -> Result<(), ServeError> {
    tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            shutdown.requested().await;
        })
        .await
        .map_err(|e| ServeError::Transport(path.to_path_buf(), e))
}

/// Bind the socket of `endpoint` now, then serve `routes` there on a task of its own
/// until `shutdown`. `services` names them in the logs (`identity and node`). A
/// server that fails later is logged; the role goes on (its other work does not
/// depend on the socket).
pub fn spawn(
    endpoint: &str,
    services: &'static str,
    routes: Routes,
    shutdown: Shutdown,
) -> Result<JoinHandle<()>, ServeError> {
    let path = endpoint_path(endpoint);
    let listener = bind_unix(&path)?;
    info!(socket = %path.display(), "serving CSI {services}");
    Ok(tokio::spawn(async move {
        if let Err(e) = serve(listener, &path, routes, shutdown).await {
            error!(error = %error_chain(&e), "CSI server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_socket_paths() {
        assert_eq!(
            endpoint_path("unix:///csi/csi.sock"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            endpoint_path("/csi/csi.sock"),
            PathBuf::from("/csi/csi.sock")
        );
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_anything_else_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sub/csi.sock");
        let first = bind_unix(&sock).unwrap();
        drop(first);
        // The socket file stays behind after its listener: a restart binds again.
        assert!(sock.exists());
        bind_unix(&sock).unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"data").unwrap();
        assert!(matches!(bind_unix(&file), Err(ServeError::NotASocket(_))));
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
    }
}
