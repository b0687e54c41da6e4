//! A scripted API server (as kube-rs's controller-rs tests its reconcile): the client
//! talks to a `tower_test` mock; a task answers each request with the next reply of
//! the script, after checking it is the request expected there (method, path and,
//! where it matters, the body). Events (published off the reconcile's path) are
//! answered whenever they come and logged in the same transcript, so a test can say
//! they came after the writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// A check of a request's body: `Err(why)` when it is not the one expected.
type BodyCheck = Box<dyn Fn(&Value) -> Result<(), String> + Send>;

/// One expected request and its reply.
pub struct Expect {
    method: &'static str,
    path: String,
    body: Option<BodyCheck>,
    status: u16,
    reply: Value,
}

/// Expect `method path` (the path without the query).
pub fn expect(method: &'static str, path: impl Into<String>) -> Expect {
    Expect {
        method,
        path: path.into(),
        body: None,
        status: 200,
        reply: json!({}),
    }
}

impl Expect {
    /// Check the request's body too.
    pub fn body(mut self, check: impl Fn(&Value) -> Result<(), String> + Send + 'static) -> Self {
        self.body = Some(Box::new(check));
        self
    }

    /// Reply `body` with status 200.
    pub fn ok(mut self, body: Value) -> Self {
        self.reply = body;
        self
    }

    /// Reply with an API error (a `Status`) of `code`.
    pub fn fail(mut self, code: u16, reason: &str) -> Self {
        self.status = code;
        self.reply = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("scripted {reason}"), "reason": reason, "code": code,
        });
        self
    }
}

/// What the server saw: one line per request, in order (`PATCH /apis/…` or
/// `EVENT reason on kind`), and each departure from the script.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    pub lines: Vec<String>,
    pub errors: Vec<String>,
    /// Scripted requests not made.
    pub left: usize,
}

impl Transcript {
    /// The requests, Events left out.
    pub fn requests(&self) -> Vec<&str> {
        self.lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("EVENT"))
            .collect()
    }

    /// The Events, sorted (they are published concurrently).
    pub fn events(&self) -> Vec<&str> {
        let mut events: Vec<&str> = self
            .lines
            .iter()
            .map(String::as_str)
            .filter(|l| l.starts_with("EVENT"))
            .collect();
        events.sort();
        events
    }

    /// Whether every Event came after every other request.
    pub fn events_last(&self) -> bool {
        let first_event = self.lines.iter().position(|l| l.starts_with("EVENT"));
        let last_request = self.lines.iter().rposition(|l| !l.starts_with("EVENT"));
        match (first_event, last_request) {
            (Some(e), Some(r)) => e > r,
            _ => true,
        }
    }
}

/// The running server.
pub struct Server {
    transcript: Arc<Mutex<Transcript>>,
}

/// A client whose requests `script` answers, in order.
pub fn serve(script: Vec<Expect>) -> (Client, Server) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let transcript = Arc::new(Mutex::new(Transcript {
        left: script.len(),
        ..Default::default()
    }));
    let log = transcript.clone();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_string());
            if path.starts_with("/apis/events.k8s.io/") {
                let line = format!(
                    "EVENT {} on {}",
                    body["reason"].as_str().unwrap_or("?"),
                    body["regarding"]["kind"].as_str().unwrap_or("?")
                );
                log.lock().unwrap().lines.push(line);
                let mut event = body.clone();
                event["metadata"]["name"] = json!("e");
                send.send_response(reply(201, &event));
                continue;
            }
            let line = format!("{method} {path}");
            let (status, answer) = {
                let mut log = log.lock().unwrap();
                log.lines.push(line.clone());
                match script.next() {
                    Some(e) if e.method == method && e.path == path => {
                        log.left -= 1;
                        if let Some(Err(why)) = e.body.as_ref().map(|check| check(&body)) {
                            log.errors.push(format!("{line}: {why}"));
                        }
                        (e.status, e.reply)
                    }
                    Some(e) => {
                        log.left -= 1;
                        log.errors
                            .push(format!("expected {} {}, got {line}", e.method, e.path));
                        (500, json!({}))
                    }
                    None => {
                        log.errors.push(format!("unexpected {line}"));
                        (500, json!({}))
                    }
                }
            };
            send.send_response(reply(status, &answer));
        }
    });
    (Client::new(service, "default"), Server { transcript })
}

fn reply(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).expect("JSON")))
        .expect("a response")
}

impl Server {
    /// The transcript once `events` Events came (or two seconds passed), and nothing
    /// more for a moment (a request made after the reconcile returned is seen).
    pub async fn finish(self, events: usize) -> Transcript {
        for _ in 0..200 {
            let seen = self
                .transcript
                .lock()
                .unwrap()
                .lines
                .iter()
                .filter(|l| l.starts_with("EVENT"))
                .count();
            if seen >= events {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.transcript.lock().unwrap().clone()
    }
}

/// A body check: the value at JSON pointer `at` is `want`.
pub fn at(pointer: &'static str, want: Value) -> impl Fn(&Value) -> Result<(), String> + Send {
    move |body: &Value| match body.pointer(pointer) {
        Some(v) if *v == want => Ok(()),
        other => Err(format!("{pointer} is {other:?}, not {want}")),
    }
}
