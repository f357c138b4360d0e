//! The eleven tools of `baton mcp` (docs/agents.md) as the model sees them: their names,
//! descriptions and JSON input schemas (derived from the argument types below), and the one
//! parser that turns a call's arguments into those types or a message naming the argument
//! (answered as an error result, `isError: true`, as SEP-1303 asks in the 2025-11-25 spec,
//! so the model can read it and fix the call).
//! What must never live here: any call to Baton (that is `agent.rs`).

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use rmcp::schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// The longest `wait_seconds` a claim takes: a tool call must come back to the model.
pub const WAIT_SECONDS_MAX: u64 = 60;

/// `claim {resource | path, mode?, reason?, wait_seconds?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct ClaimArgs {
    /// What to claim that is not a file: a name such as `migrations`, `dev-server`,
    /// `deploy/prod`. For a file or directory, give `path` instead.
    #[serde(default)]
    pub resource: Option<String>,
    /// A file or directory of your working tree to claim (absolute, or relative to where this
    /// server runs). It is named as every agent's edits of it are named, by its repository and
    /// its path in it: `github.com/acme/web/src/auth.rs`.
    #[serde(default)]
    pub path: Option<String>,
    /// `exclusive` (that path only, the default) or `subtree` (the path and everything under
    /// it).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Why you want it; shown to other agents.
    #[serde(default)]
    pub reason: Option<String>,
    /// While someone else holds it, wait up to this many seconds (0..=60) for it to be
    /// released or to expire.
    #[serde(default)]
    #[schemars(range(min = 0, max = 60))]
    pub wait_seconds: Option<u64>,
}

/// A claim's mode.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(crate = "rmcp::schemars")]
pub enum Mode {
    /// That path only.
    Exclusive,
    /// The path and everything under it.
    Subtree,
}

/// `release {resource | path}`, `who_holds {resource | path}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct ResourceArgs {
    /// The name, as `claim` took it or `my_claims` lists it.
    #[serde(default)]
    pub resource: Option<String>,
    /// A file or directory of your working tree, as `claim` took it.
    #[serde(default)]
    pub path: Option<String>,
}

/// `my_claims {}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct NoArgs {}

/// `list_claims {prefix?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListArgs {
    /// Only claims on paths starting with this prefix.
    #[serde(default)]
    pub prefix: Option<String>,
}

/// `write_value {key, value, claim?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteArgs {
    /// The key, a `/`-separated path.
    pub key: String,
    /// Any JSON value.
    pub value: Value,
    /// A resource you hold a claim on: the write is applied only while that claim is live
    /// (fenced with its token), so a write after you lost it is refused.
    #[serde(default)]
    pub claim: Option<String>,
}

/// `read_value {key}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadArgs {
    /// The key.
    pub key: String,
}

/// `add_task {queue, payload, priority?, depends_on?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct AddTaskArgs {
    /// The queue's name.
    pub queue: String,
    /// Any JSON value describing the work.
    pub payload: Value,
    /// Higher is handed out first (default 0).
    #[serde(default)]
    pub priority: Option<i32>,
    /// Ids of tasks in the same queue that must be done first.
    #[serde(default)]
    pub depends_on: Option<Vec<String>>,
}

/// `next_task {queue}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct QueueArgs {
    /// The queue's name.
    pub queue: String,
}

/// `complete_task {queue, id, result?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct CompleteArgs {
    /// The queue's name.
    pub queue: String,
    /// The id of a task you claimed with `next_task`.
    pub id: String,
    /// Any JSON value kept on the task as its result.
    #[serde(default)]
    pub result: Option<Value>,
}

/// `fail_task {queue, id, reason}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct FailArgs {
    /// The queue's name.
    pub queue: String,
    /// The id of a task you claimed with `next_task`.
    pub id: String,
    /// Why this attempt failed; kept on the task.
    pub reason: String,
}

/// The tools, in the order `tools/list` shows them.
pub fn tools() -> Vec<Tool> {
    vec![
        tool::<ClaimArgs>(
            "claim",
            "Claim a file or directory (`path`) or another resource (`resource`: a migration, \
             a dev server) before working on it. Granted: it is yours until you release it or \
             this server stops. Denied: the answer names who holds it and for how long; pick \
             other work, wait (wait_seconds), or escalate. Never work on a resource someone \
             else holds.",
            false,
        ),
        tool::<ResourceArgs>(
            "release",
            "Release a resource you claimed, as soon as you are done with it.",
            false,
        ),
        tool::<NoArgs>(
            "my_claims",
            "List the resources and tasks this agent holds right now.",
            true,
        ),
        tool::<ResourceArgs>(
            "who_holds",
            "Who holds a resource, with what fence, for how long.",
            true,
        ),
        tool::<ListArgs>(
            "list_claims",
            "List every live claim of every agent, optionally under a path prefix.",
            true,
        ),
        tool::<WriteArgs>(
            "write_value",
            "Write a JSON value under a key in Baton's shared store. With `claim`, the write \
             is fenced: applied only while your claim on that resource is live.",
            false,
        ),
        tool::<ReadArgs>(
            "read_value",
            "Read a value from Baton's shared store, with its revision and the fence that \
             wrote it.",
            true,
        ),
        tool::<AddTaskArgs>(
            "add_task",
            "Add a task to a work queue, for this or another agent to claim with next_task.",
            false,
        ),
        tool::<QueueArgs>(
            "next_task",
            "Claim the best ready task of a queue. Work on it, then complete_task or \
             fail_task it.",
            false,
        ),
        tool::<CompleteArgs>(
            "complete_task",
            "Complete a task you claimed with next_task, optionally with a result.",
            false,
        ),
        tool::<FailArgs>(
            "fail_task",
            "Fail this attempt of a task you claimed; it is ready again while attempts remain.",
            false,
        ),
    ]
}

fn tool<T: JsonSchema + 'static>(
    name: &'static str,
    description: &'static str,
    read_only: bool,
) -> Tool {
    Tool::new(name, description, Arc::new(JsonObject::new()))
        .with_input_schema::<T>()
        .with_annotations(ToolAnnotations::new().read_only(read_only))
}

/// The arguments of a call as `T`, or a message naming the argument that is missing, unknown
/// or of the wrong type.
pub fn parse<T: DeserializeOwned>(tool: &str, arguments: Option<JsonObject>) -> Result<T, String> {
    let arguments = Value::Object(arguments.unwrap_or_default());
    serde_path_to_error::deserialize(arguments).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            invalid_argument(tool, &inner.to_string())
        } else {
            invalid_argument(tool, &format!("argument `{path}`: {inner}"))
        }
    })
}

/// The message for a bad argument of `tool`; `message` names the argument.
pub fn invalid_argument(tool: &str, message: &str) -> String {
    format!("{tool}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_tool_takes_an_object_that_rejects_unknown_arguments() {
        let tools = tools();
        assert_eq!(tools.len(), 11);
        for tool in &tools {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert_eq!(
                tool.input_schema["additionalProperties"], false,
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn a_bad_argument_is_named_in_the_error() {
        let check = |arguments: Value, named: &str| {
            let Value::Object(arguments) = arguments else {
                panic!("an object");
            };
            let error =
                parse::<ClaimArgs>("claim", Some(arguments.clone())).expect_err("a bad argument");
            assert!(
                error.contains(named),
                "{arguments:?}: {error} should name {named}"
            );
        };
        check(json!({"resource": ["a"]}), "resource");
        check(json!({"resource": "a", "mode": "shared"}), "mode");
        check(json!({"resource": "a", "wait_seconds": -1}), "wait_seconds");
        check(json!({"resource": "a", "ttl": 5}), "ttl");
    }

    #[test]
    fn absent_optional_arguments_parse() {
        let list: ListArgs = parse("list_claims", None).expect("no arguments at all");
        assert!(list.prefix.is_none());
        let Value::Object(arguments) = json!({"resource": "a"}) else {
            panic!("an object");
        };
        let claim: ClaimArgs = parse("claim", Some(arguments)).expect("only the resource");
        assert_eq!(claim.resource.as_deref(), Some("a"));
        assert!(claim.mode.is_none() && claim.reason.is_none() && claim.wait_seconds.is_none());
    }
}
