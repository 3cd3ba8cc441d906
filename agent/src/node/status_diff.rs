//! The strategic merge patch that turns one pod status into another, as the kubelet computes
//! its status patches: only what changed is sent, a field that is gone is sent as `null` (so the
//! server drops it: a container going from `running` to `terminated` must lose `running`, a
//! condition's cleared `reason` must go), and the lists the API merges by a key (conditions by
//! `type`, container statuses by `name`, pod and host IPs by `ip`) are sent item by item, an item
//! that is gone as `$patch: delete`. A condition the agent does not own (a readiness gate's, the
//! scheduler's) is never deleted: the agent only writes its own.
use serde_json::{Map, Value};

/// The conditions the agent writes (the kubelet's own, and the one it shares).
const OWN_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    crate::status::DISRUPTION_TARGET,
];

/// The key the API merges list `field`'s items by, `None`: the list is replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses" => {
            Some("name")
        }
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

/// The patch turning object `old` into object `new` (`None`: they are equal).
pub fn diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let d = diff_object(o, n);
            (!d.is_empty()).then_some(Value::Object(d))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

fn diff_object(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, n) in new {
        let Some(o) = old.get(k) else {
            out.insert(k.clone(), n.clone());
            continue;
        };
        if o == n {
            continue;
        }
        let changed = match (o, n, merge_key(k)) {
            (Value::Object(o), Value::Object(n), _) => Value::Object(diff_object(o, n)),
            (Value::Array(o), Value::Array(n), Some(key)) => {
                diff_list(o, n, key, k == "conditions").unwrap_or_else(|| n.clone().into())
            }
            _ => n.clone(),
        };
        out.insert(k.clone(), changed);
    }
    for (k, o) in old {
        if new.contains_key(k) {
            continue;
        }
        // A keyed list gone whole loses its items one by one (conditions: only the agent's).
        let gone = match (o, merge_key(k)) {
            (Value::Array(o), Some(key)) => diff_list(o, &[], key, k == "conditions"),
            _ => None,
        };
        match gone {
            Some(Value::Array(items)) if items.is_empty() => {}
            Some(items) => {
                out.insert(k.clone(), items);
            }
            None => {
                out.insert(k.clone(), Value::Null);
            }
        }
    }
    out
}

/// The items of list `new` that differ from `old`'s item with the same `key` (as their own
/// diffs, keyed), then a delete for each of `old`'s keys `new` lacks (for `conditions`, only
/// the agent's own). `None` when an item has no key: the list is then sent whole.
fn diff_list(old: &[Value], new: &[Value], key: &str, conditions: bool) -> Option<Value> {
    let key_of = |v: &Value| v.get(key).filter(|k| k.is_string()).cloned();
    let mut items = Vec::new();
    for n in new {
        let k = key_of(n)?;
        match old.iter().find(|o| key_of(o).as_ref() == Some(&k)) {
            Some(o) if o == n => {}
            Some(Value::Object(o)) => {
                let Value::Object(n) = n else {
                    return None;
                };
                let mut d = diff_object(o, n);
                d.insert(key.to_owned(), k);
                items.push(Value::Object(d));
            }
            _ => items.push(n.clone()),
        }
    }
    for o in old {
        let k = key_of(o)?;
        let kept = new.iter().any(|n| key_of(n).as_ref() == Some(&k));
        let ours = !conditions || k.as_str().is_some_and(|t| OWN_CONDITIONS.contains(&t));
        if !kept && ours {
            let mut d = Map::new();
            d.insert(key.to_owned(), k);
            d.insert("$patch".to_owned(), Value::String("delete".to_owned()));
            items.push(Value::Object(d));
        }
    }
    Some(Value::Array(items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_container_leaving_running_drops_it_and_a_cleared_reason_is_nulled() {
        let old = json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                {"type": "example.com/gate", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "a", "state": {"running": {"startedAt": "t0"}}, "ready": true},
                {"name": "b", "state": {"waiting": {"reason": "ContainerCreating"}}},
            ],
            "podIP": "10.0.0.1",
        });
        let new = json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 0}}, "ready": false},
            ],
        });
        let patch = diff(&old, &new).expect("a change");
        assert_eq!(
            patch,
            json!({
                "conditions": [{"type": "Ready", "status": "True", "reason": null}],
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0}, "running": null},
                     "ready": false},
                    {"name": "b", "$patch": "delete"},
                ],
                "podIP": null,
            })
        );
        assert_eq!(diff(&new, &new), None);
        // A status without conditions (a pod no worker wrote yet) leaves a foreign one alone.
        let pending = json!({"phase": "Pending"});
        assert_eq!(
            diff(&old, &pending),
            Some(json!({
                "phase": "Pending",
                "conditions": [
                    {"type": "Ready", "$patch": "delete"},
                    {"type": "PodScheduled", "$patch": "delete"},
                ],
                "containerStatuses": [
                    {"name": "a", "$patch": "delete"},
                    {"name": "b", "$patch": "delete"},
                ],
                "podIP": null,
            }))
        );
        let only_foreign = json!({"conditions": [{"type": "example.com/gate", "status": "True"}]});
        assert_eq!(
            diff(&only_foreign, &pending),
            Some(json!({"phase": "Pending"}))
        );
    }

    #[test]
    fn a_list_without_keys_is_sent_whole() {
        let old = json!({"conditions": [{"status": "True"}]});
        let new = json!({"conditions": [{"status": "False"}]});
        assert_eq!(diff(&old, &new), Some(new.clone()));
    }
}
