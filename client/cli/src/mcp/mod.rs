//! `baton mcp` (docs/agents.md): a Model Context Protocol server over stdio that gives one
//! agent Baton's claims, fenced store and work queues as eleven tools (`tools.rs`), backed by
//! one Baton session per process (`agent.rs`). The session is made at the first claim, kept
//! alive by the client crate every third of `--ttl`, and ended when stdin closes or on
//! SIGTERM or Ctrl-C, which releases everything the agent holds at once.
//!
//! This file is the MCP side: the `ServerHandler` (tool list, dispatch by name, results with
//! a text line and `structuredContent`, cancellations) and the process lifetime. Stdout
//! carries MCP messages only; our own messages go to stderr. What must never live here: calls
//! to Baton (those are `agent.rs`), and a session id in any output.

mod agent;
mod calls;
mod tools;
mod transport;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton_client::{default_holder, Client, Error};
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, RequestId,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::cli::duration::{format_duration, parse_duration};
use crate::cli::Global;
use agent::{Agent, Outcome, Taken};
use calls::{Call, Calls};

/// Longest single attempt of a request to Baton.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a tool call keeps retrying Baton before it answers "unreachable".
const RETRY_BUDGET: Duration = Duration::from_secs(8);
/// Longest a call waits for cancelled calls to finish giving back what they took.
const CANCELLED_WAIT_MAX: Duration = Duration::from_secs(10);

/// What the server tells the model when it connects.
const INSTRUCTIONS: &str = "Baton coordinates the agents working on the same things. Before \
editing a file or running something shared (a migration, a dev server), `claim` it. If the \
claim is denied, someone else holds it: the answer says who and for how long; pick other work, \
wait (claim with wait_seconds), or escalate. Never work on a resource someone else holds. \
Release what you are done with. If a result says your session was lost, stop acting on the \
claims it names.";

/// `baton mcp` flags (besides the global `--endpoints`, `--holder`, `--namespace`, `--token`).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// TTL of this agent's Baton session; it is renewed every third of it while the server
    /// runs, and everything it holds is freed this long after the server dies.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Treat this directory as the repository root of the files under it, for the `path`
    /// arguments of the tools (default: each file's git top level).
    #[arg(long)]
    pub root: Option<std::path::PathBuf>,
    /// The repository identity of the working directory's repository (or of --root),
    /// instead of its `origin` remote: the first part of every file name it claims.
    #[arg(long)]
    pub repo: Option<String>,
}

/// Serves MCP on stdin/stdout until stdin closes, SIGTERM or Ctrl-C; then ends the session.
/// Returns the exit code.
pub async fn serve(global: &Global, args: McpArgs) -> u8 {
    let client = match client(global) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error[{}]: {}", error.code(), error.message());
            return 2;
        }
    };
    eprintln!(
        "baton mcp: serving as holder {} (session TTL {}), Baton at {}",
        client.holder(),
        format_duration(args.ttl),
        global.endpoints().join(",")
    );
    let naming = baton_client::FileNaming {
        root: args.root,
        repo: args.repo,
    };
    let agent = Arc::new(Agent::new(client, args.ttl, naming));
    let calls: Arc<Calls<Taken>> = Arc::default();
    let server = BatonServer {
        agent: Arc::clone(&agent),
        tools: Arc::new(tools::tools()),
        calls: Arc::clone(&calls),
        settling: Arc::default(),
    };
    let transport = transport::stdio(move |id: &RequestId| calls.cancel(id));
    let code = match server.serve(transport).await {
        Ok(running) => {
            let cancel = running.cancellation_token();
            tokio::select! {
                quit = running.waiting() => {
                    tracing::debug!(?quit, "the MCP connection ended");
                }
                () = terminated() => {
                    cancel.cancel();
                }
            }
            0
        }
        Err(error) => {
            eprintln!("error[MCP]: the MCP handshake failed: {error}");
            1
        }
    };
    match agent.shutdown().await {
        Ok(released) if released.is_empty() => {}
        Ok(released) => eprintln!(
            "baton mcp: ended the session, released {}",
            released.join(", ")
        ),
        Err(error) => eprintln!(
            "baton mcp: could not end the session ({error}); what it holds is freed when its TTL runs out"
        ),
    }
    code
}

fn client(global: &Global) -> Result<Client, Error> {
    let holder = global
        .holder()
        .unwrap_or_else(|| format!("{}:{}", default_holder(), std::process::id()));
    let builder = Client::builder(global.endpoints())
        .holder(holder)
        .request_timeout(REQUEST_TIMEOUT)
        .retry_budget(RETRY_BUDGET);
    global.configure(builder)?.build()
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                tokio::select! {
                    _ = sigterm.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The MCP server: the tool list, the dispatch to [`Agent`], and the calls in flight.
#[derive(Debug, Clone)]
struct BatonServer {
    agent: Arc<Agent>,
    tools: Arc<Vec<Tool>>,
    calls: Arc<Calls<Taken>>,
    /// Held while what cancelled calls took after their answer is given back, so that every
    /// call after a cancel sees it done.
    settling: Arc<tokio::sync::Mutex<()>>,
}

/// The arguments of a call parsed, then `run`; bad arguments are an error result.
async fn with<T: DeserializeOwned, F: Future<Output = Outcome>>(
    name: &str,
    arguments: Option<JsonObject>,
    run: impl FnOnce(T) -> F,
) -> Outcome {
    match tools::parse(name, arguments) {
        Ok(arguments) => run(arguments).await,
        Err(message) => Outcome::invalid(message),
    }
}

impl BatonServer {
    async fn call(
        &self,
        request: CallToolRequestParams,
        stop: &CancellationToken,
    ) -> Result<Outcome, McpError> {
        let name = request.name.as_ref();
        let arguments = request.arguments;
        let agent = &self.agent;
        Ok(match name {
            "claim" => with(name, arguments, |args| agent.claim(args, stop)).await,
            "release" => with(name, arguments, |args| agent.release(args)).await,
            "my_claims" => {
                with(name, arguments, |_: tools::NoArgs| async {
                    agent.my_claims()
                })
                .await
            }
            "who_holds" => with(name, arguments, |args| agent.who_holds(args)).await,
            "list_claims" => with(name, arguments, |args| agent.list_claims(args)).await,
            "write_value" => with(name, arguments, |args| agent.write_value(args)).await,
            "read_value" => with(name, arguments, |args| agent.read_value(args)).await,
            "add_task" => with(name, arguments, |args| agent.add_task(args)).await,
            "next_task" => with(name, arguments, |args| agent.next_task(args)).await,
            "complete_task" => with(name, arguments, |args| agent.complete_task(args)).await,
            "fail_task" => with(name, arguments, |args| agent.fail_task(args)).await,
            unknown => {
                return Err(McpError::invalid_params(
                    format!(
                        "unknown tool `{unknown}`: the tools are {}",
                        self.tools
                            .iter()
                            .map(|tool| tool.name.as_ref())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                ))
            }
        })
    }

    /// Settles the cancels read so far: waits for cancelled calls still running to give back
    /// what they took, and gives back what calls cancelled after their answer took. `own` is
    /// the call that asks, if one does: it never waits for itself, and, once cancelled, for
    /// nobody (its answer is not sent), so no two calls wait for each other.
    async fn settle(&self, own: Option<&Call<Taken>>) {
        if !own.is_some_and(|call| call.cancelled().is_cancelled()) {
            let except = own.map(Call::id);
            if tokio::time::timeout(CANCELLED_WAIT_MAX, self.calls.cancelled_finished(except))
                .await
                .is_err()
            {
                tracing::warn!("a cancelled call is still giving back what it took");
            }
        }
        let _settling = self.settling.lock().await;
        for taken in self.calls.take_to_give_back() {
            self.agent.give_back(taken).await;
        }
    }
}

impl ServerHandler for BatonServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("baton", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn on_cancelled(
        &self,
        _notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        // The registry heard of this cancel from the transport; give back now what the
        // cancelled call took, even if no other call comes.
        self.settle(None).await;
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // Cancelled by the client's cancel (as the transport reads it) or when the server
        // stops.
        let call = self
            .calls
            .start(context.id.clone(), context.ct.child_token());
        self.settle(Some(&call)).await;
        let outcome = self.call(request, call.cancelled()).await?;
        if let Err(taken) = call.answered(outcome.taken.clone()) {
            self.agent.give_back(taken).await;
        }
        let outcome = if call.cancelled().is_cancelled() {
            // Not sent (the client stopped waiting): the notes stay for the next result.
            Outcome::cancelled()
        } else {
            self.agent.announce(outcome)
        };
        drop(call);
        let mut result = if outcome.is_error {
            CallToolResult::error(vec![ContentBlock::text(outcome.text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(outcome.text)])
        };
        result.structured_content = Some(outcome.structured);
        Ok(result.into())
    }
}
