//! Counting every request the API client sends, at the HTTP layer
//! (`tessera_api_requests_total`).
//!
//! ```text
//!  kube::Client ─▶ CountRequests ─▶ kube's stack (retry, auth, base URI, hyper)
//!                  │ on the response (or the transport error):
//!                  └─▶ ApiRequests{verb, group, resource, subresource, code} += 1
//! ```
//!
//! [`classify`] turns a request path into the low-cardinality labels: the API group,
//! the resource and the subresource. Object names and namespaces never become labels.
//! A watch is one GET counted when its response starts (its code is that of the
//! start); requests kube's own retry layer repeats are counted once, with the code of
//! the last answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::metrics::{ApiRequestLabels, ApiRequests};

/// What a request path names, for labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathClass {
    /// The API group; empty for the core group (`/api/v1`).
    pub group: String,
    /// The resource (plural), or `discovery`, `version`, `other` outside the
    /// resource paths.
    pub resource: String,
    /// The subresource; empty for none.
    pub subresource: String,
}

impl PathClass {
    fn non_resource(what: &str) -> PathClass {
        PathClass {
            group: String::new(),
            resource: what.into(),
            subresource: String::new(),
        }
    }
}

/// Subresources of a namespace itself: `/api/v1/namespaces/{name}/status` is the
/// namespace's status, not a resource called `status` in it (the API server's own
/// rule, `k8s.io/apiserver` RequestInfo).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The group, resource and subresource a request path names (the query is ignored).
///
/// `/api/v1[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]` and
/// `/apis/{group}/{version}[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]`;
/// shorter paths under `/api` and `/apis` are `discovery`, `/version` is `version`,
/// anything else `other`.
pub fn classify(path: &str) -> PathClass {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (group, rest) = match parts.as_slice() {
        ["version", ..] => return PathClass::non_resource("version"),
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        ["api" | "apis", ..] => return PathClass::non_resource("discovery"),
        _ => return PathClass::non_resource("other"),
    };
    let rest = match rest {
        ["namespaces", _ns, next, tail @ ..] if !NAMESPACE_SUBRESOURCES.contains(next) => {
            let mut r = vec![*next];
            r.extend_from_slice(tail);
            r
        }
        _ => rest.to_vec(),
    };
    match rest.as_slice() {
        [] => PathClass::non_resource("discovery"),
        [resource] | [resource, _] => PathClass {
            group: group.into(),
            resource: (*resource).into(),
            subresource: String::new(),
        },
        [resource, _name, subresource, ..] => PathClass {
            group: group.into(),
            resource: (*resource).into(),
            subresource: (*subresource).into(),
        },
    }
}

/// A tower layer that counts each request in `ApiRequests` when it is answered.
#[derive(Clone)]
pub struct CountRequests {
    counters: ApiRequests,
}

impl CountRequests {
    /// Count into `counters`.
    pub fn new(counters: ApiRequests) -> Self {
        CountRequests { counters }
    }
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counters: self.counters.clone(),
        }
    }
}

/// The service [`CountRequests`] wraps around the client's stack.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counters: ApiRequests,
}

impl<S, B, RB> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let class = classify(req.uri().path());
        let verb = req.method().as_str().to_owned();
        let counters = self.counters.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            counters
                .get_or_create(&ApiRequestLabels {
                    verb,
                    group: class.group,
                    resource: class.resource,
                    subresource: class.subresource,
                    code,
                })
                .inc();
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_group_resource_and_subresource_without_names() {
        for (path, group, resource, subresource) in [
            // Core group, cluster-scoped and namespaced.
            ("/api/v1/nodes", "", "nodes", ""),
            ("/api/v1/nodes/node-a", "", "nodes", ""),
            (
                "/api/v1/persistentvolumes?limit=500",
                "",
                "persistentvolumes",
                "",
            ),
            ("/api/v1/namespaces/ns-1/events", "", "events", ""),
            ("/api/v1/namespaces/ns-1/pods/p-1/log", "", "pods", "log"),
            ("/api/v1/pods?watch=true&resourceVersion=1", "", "pods", ""),
            // A namespace itself, its status and finalize subresources.
            ("/api/v1/namespaces", "", "namespaces", ""),
            ("/api/v1/namespaces/ns-1", "", "namespaces", ""),
            ("/api/v1/namespaces/ns-1/status", "", "namespaces", "status"),
            (
                "/api/v1/namespaces/ns-1/finalize",
                "",
                "namespaces",
                "finalize",
            ),
            // Named groups.
            (
                "/apis/tessera.io/v1alpha1/volumes",
                "tessera.io",
                "volumes",
                "",
            ),
            (
                "/apis/tessera.io/v1alpha1/volumeattachments/pvc-1/status",
                "tessera.io",
                "volumeattachments",
                "status",
            ),
            (
                "/apis/tessera.io/v1alpha1/mountpods/pvc-1-node-a?fieldManager=x",
                "tessera.io",
                "mountpods",
                "",
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/tessera/leases/tessera-controller",
                "coordination.k8s.io",
                "leases",
                "",
            ),
            (
                "/apis/events.k8s.io/v1/namespaces/default/events",
                "events.k8s.io",
                "events",
                "",
            ),
            // Outside the resource paths.
            ("/version", "", "version", ""),
            ("/api", "", "discovery", ""),
            ("/api/v1", "", "discovery", ""),
            ("/apis", "", "discovery", ""),
            ("/apis/tessera.io", "", "discovery", ""),
            ("/apis/tessera.io/v1alpha1", "", "discovery", ""),
            ("/openapi/v3", "", "other", ""),
            ("/healthz", "", "other", ""),
            ("", "", "other", ""),
        ] {
            assert_eq!(
                classify(path),
                PathClass {
                    group: group.into(),
                    resource: resource.into(),
                    subresource: subresource.into(),
                },
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn a_request_is_counted_with_its_code_or_as_an_error() {
        use tower::ServiceExt;
        let counters = ApiRequests::default();
        let layer = CountRequests::new(counters.clone());
        let answer = |status: u16| {
            tower::service_fn(move |_req: http::Request<()>| async move {
                Ok::<_, std::io::Error>(http::Response::builder().status(status).body(()).unwrap())
            })
        };
        let req = |method: &str, uri: &str| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
        };
        let svc = layer.layer(answer(409));
        svc.oneshot(req("POST", "/apis/tessera.io/v1alpha1/volumes"))
            .await
            .unwrap();
        let failing = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
            Err::<http::Response<()>, _>(std::io::Error::other("refused"))
        }));
        failing
            .oneshot(req("GET", "/api/v1/namespaces/x/events/e"))
            .await
            .unwrap_err();
        let count = |verb: &str, group: &str, resource: &str, code: &str| {
            counters
                .get_or_create(&ApiRequestLabels {
                    verb: verb.into(),
                    group: group.into(),
                    resource: resource.into(),
                    subresource: String::new(),
                    code: code.into(),
                })
                .get()
        };
        assert_eq!(count("POST", "tessera.io", "volumes", "409"), 1);
        assert_eq!(count("GET", "", "events", "error"), 1);
        assert_eq!(count("POST", "tessera.io", "volumes", "201"), 0);
    }
}
