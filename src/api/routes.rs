//! Which request gets which answer: a pure function of the method, the
//! path and the shared state, so every route is tested without a socket.

use std::time::SystemTime;

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::{ClusterSlot, Shared, Verdict};

/// What to answer.
#[derive(Debug, PartialEq)]
pub(super) enum Reply {
    Json(StatusCode, Value),
    /// The Server-Sent Events stream.
    Events,
    /// The metrics, in the format the request's `Accept` asks for.
    Metrics,
}

/// Routes a request. Query strings never reach here (the server passes
/// the path only); HEAD is answered as GET, and the server drops the body.
pub(super) fn route(method: &Method, path: &str, shared: &Shared, now: SystemTime) -> Reply {
    if method != Method::GET && method != Method::HEAD {
        return Reply::Json(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": "read-only API: only GET"}),
        );
    }
    match path {
        "/healthz" => {
            let report = shared.health_report(now);
            let code = match report.status {
                Verdict::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
                Verdict::Healthy | Verdict::Degraded => StatusCode::OK,
            };
            Reply::Json(code, to_json(&report))
        }
        "/v1/workloads" => {
            let freezes = shared.freezes();
            let views = shared
                .snapshot()
                .iter()
                .map(|v| with_frozen(to_json(v.as_ref()), &v.name, &freezes))
                .collect();
            Reply::Json(StatusCode::OK, Value::Array(views))
        }
        "/v1/freezes" => {
            let freezes = shared.freezes();
            Reply::Json(
                StatusCode::OK,
                json!({
                    "node": freezes.node.as_ref().map(|f| f.summary()),
                    "instances": freezes
                        .instances
                        .iter()
                        .map(|(n, f)| (n.clone(), f.summary()))
                        .collect::<serde_json::Map<_, _>>(),
                }),
            )
        }
        "/v1/events" => Reply::Events,
        "/metrics" => Reply::Metrics,
        "/v1/cluster" => match shared.cluster() {
            ClusterSlot::Off => Reply::Json(StatusCode::NOT_FOUND, json!({"error": "not in cluster mode"})),
            ClusterSlot::Waiting => Reply::Json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "the cluster view is being gathered; ask again"}),
            ),
            ClusterSlot::View(view) => Reply::Json(StatusCode::OK, (*view).clone()),
        },
        _ => match path
            .strip_prefix("/v1/workloads/")
            .map(|name| (name, shared.view(name)))
        {
            Some((name, Some(view))) => Reply::Json(
                StatusCode::OK,
                with_frozen(to_json(view.as_ref()), name, &shared.freezes()),
            ),
            Some((name, None)) => Reply::Json(
                StatusCode::NOT_FOUND,
                json!({"error": format!("no workload {name:?}")}),
            ),
            None => Reply::Json(StatusCode::NOT_FOUND, json!({"error": "not found"})),
        },
    }
}

/// A workload's view with what freezes it.
fn with_frozen(mut view: Value, name: &str, freezes: &crate::state::freeze::Freezes) -> Value {
    if let Value::Object(o) = &mut view {
        o.insert(
            "frozen".into(),
            freezes.of(name).map_or(Value::Null, |f| f.summary()),
        );
    }
    view
}

/// Every type served here serializes (plain data, string keys); a
/// failure would still be an answer, not a panic.
fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::health::Health;
    use crate::api::view;

    #[test]
    fn routes() {
        let shared = Shared::new(Duration::from_secs(10));
        let now = SystemTime::now();
        shared.publish(view("a"));
        let get = Method::GET;
        let cases: &[(&Method, &str, StatusCode, &str)] = &[
            // (method, path, status, a fragment of the JSON body)
            (
                &get,
                "/healthz",
                StatusCode::SERVICE_UNAVAILABLE,
                r#""status":"unhealthy""#,
            ),
            (
                &get,
                "/v1/workloads",
                StatusCode::OK,
                r#"[{"active_state":"active""#,
            ),
            (&Method::HEAD, "/v1/workloads", StatusCode::OK, r#""name":"a""#),
            (
                &get,
                "/v1/workloads/a",
                StatusCode::OK,
                r#""invocation_id":"abc""#,
            ),
            (
                &get,
                "/v1/workloads/b",
                StatusCode::NOT_FOUND,
                r#"no workload \"b\""#,
            ),
            (
                &get,
                "/v1/workloads/",
                StatusCode::NOT_FOUND,
                r#"no workload \"\""#,
            ),
            (&get, "/", StatusCode::NOT_FOUND, r#"{"error":"not found"}"#),
            (&get, "/v1/workloadsx", StatusCode::NOT_FOUND, "not found"),
            (
                &Method::POST,
                "/v1/workloads",
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET",
            ),
            (
                &Method::DELETE,
                "/v1/workloads/a",
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET",
            ),
            (
                &Method::POST,
                "/v1/events",
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET",
            ),
        ];
        for (method, path, status, fragment) in cases {
            match route(method, path, &shared, now) {
                Reply::Json(code, body) => {
                    let body = body.to_string();
                    assert_eq!(code, *status, "{method} {path}: {body}");
                    assert!(
                        body.contains(fragment),
                        "{method} {path}: {body} lacks {fragment}"
                    );
                }
                other => panic!("{method} {path}: unexpected {other:?}"),
            }
        }
        assert_eq!(route(&get, "/v1/events", &shared, now), Reply::Events);
        assert_eq!(route(&get, "/metrics", &shared, now), Reply::Metrics);
        assert_eq!(route(&Method::HEAD, "/metrics", &shared, now), Reply::Metrics);
        assert_eq!(route(&Method::HEAD, "/v1/events", &shared, now), Reply::Events);
        shared.passed(now, Health::default());
        assert_eq!(
            route(&get, "/healthz", &shared, now),
            Reply::Json(StatusCode::OK, to_json(&shared.health_report(now)))
        );
    }

    /// Issue 14: what freezes each workload (its own freeze, else the
    /// node's), with the scope and the time, and the freezes themselves.
    #[test]
    fn freezes_show_with_their_scope() {
        use crate::state::freeze::{Freeze, Freezes, Scope};
        let shared = Shared::new(Duration::from_secs(10));
        let now = SystemTime::now();
        shared.publish(view("a"));
        shared.publish(view("b"));
        let body = |path: &str| match route(&Method::GET, path, &shared, now) {
            Reply::Json(StatusCode::OK, body) => body,
            other => panic!("{path}: {other:?}"),
        };
        assert_eq!(body("/v1/workloads/a")["frozen"], Value::Null);
        let cluster = crate::state::freeze::adopted_for_tests(Scope::Cluster, 9, "n2");
        let object = Freeze {
            scope: Scope::Object,
            ..Freeze::instance("b", "migration", std::time::UNIX_EPOCH)
        };
        shared.set_freezes(Freezes {
            node: Some(cluster),
            instances: [("b".to_string(), object)].into(),
        });
        let a = body("/v1/workloads/a");
        assert_eq!(
            (
                &a["frozen"]["frozen_scope"],
                &a["frozen"]["frozen_at"],
                &a["frozen"]["taken_by"]
            ),
            (&json!("cluster"), &json!("2026-12-03T08:00:00Z"), &json!("n2"))
        );
        let all = body("/v1/workloads");
        assert_eq!(all[1]["frozen"]["frozen_scope"], "object");
        assert_eq!(all[1]["frozen"]["frozen_at"], "1970-01-01T00:00:00Z");
        let freezes = body("/v1/freezes");
        assert_eq!(freezes["node"]["frozen_scope"], "cluster");
        assert_eq!(freezes["instances"]["b"]["reason"], "migration");
    }

    /// Issue 13, point 7: the cluster view as the agent last gathered it;
    /// each read asks for a fresh one, and none waits for etcd.
    #[test]
    fn the_cluster_view() {
        let shared = Shared::new(Duration::from_secs(10));
        let now = SystemTime::now();
        let get = |shared: &Shared| match route(&Method::GET, "/v1/cluster", shared, now) {
            Reply::Json(code, body) => (code, body),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            get(&shared),
            (StatusCode::NOT_FOUND, json!({"error": "not in cluster mode"}))
        );
        shared.cluster_waiting();
        assert!(shared.cluster_asked(), "a read asks");
        assert!(!shared.cluster_asked(), "once");
        assert_eq!(get(&shared).0, StatusCode::SERVICE_UNAVAILABLE);
        shared.set_cluster(json!({"node": "n1", "owners": []}));
        assert_eq!(
            get(&shared),
            (StatusCode::OK, json!({"node": "n1", "owners": []}))
        );
        shared.cluster_unreachable("etcd did not answer in time");
        assert_eq!(
            get(&shared),
            (
                StatusCode::OK,
                json!({"node": "n1", "owners": [], "error": "etcd did not answer in time"})
            ),
            "the last view stays, saying the refresh failed"
        );
    }
}
