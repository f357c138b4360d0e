//! `baton mcp` (docs/agents.md): a Model Context Protocol server over stdio that gives one
//! agent Baton's claims, fenced store and work queues as eleven tools (`tools.rs`), backed by
//! one Baton session per process (`agent.rs`). The session is made at the first claim, kept
//! alive by the client crate every third of `--ttl`, and ended when stdin closes or on
//! SIGTERM or Ctrl-C, which releases everything the agent holds at once.
//!
//! This file is the MCP side: the `ServerHandler` (tool list, dispatch by name, results with
//! a text line and `structuredContent`) and the process lifetime. Stdout carries MCP messages
//! only; our own messages go to stderr. What must never live here: calls to Baton (those are
//! `agent.rs`), and a session id in any output.

mod agent;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use baton_client::{default_holder, Client, Error};
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};

use crate::cli::duration::{format_duration, parse_duration};
use crate::cli::Global;
use agent::{Agent, Outcome};

/// Longest single attempt of a request to Baton.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a tool call keeps retrying Baton before it answers "unreachable".
const RETRY_BUDGET: Duration = Duration::from_secs(8);

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
    let agent = Arc::new(Agent::new(client, args.ttl));
    let server = BatonServer {
        agent: Arc::clone(&agent),
        tools: Arc::new(tools::tools()),
    };
    let code = match server.serve(rmcp::transport::stdio()).await {
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

/// The MCP server: the tool list and the dispatch to [`Agent`].
#[derive(Debug, Clone)]
struct BatonServer {
    agent: Arc<Agent>,
    tools: Arc<Vec<Tool>>,
}

impl BatonServer {
    async fn call(&self, request: CallToolRequestParams) -> Result<Outcome, McpError> {
        let name = request.name.as_ref();
        let arguments = request.arguments;
        let agent = &self.agent;
        match name {
            "claim" => agent.claim(tools::parse(name, arguments)?).await,
            "release" => agent.release(tools::parse(name, arguments)?).await,
            "my_claims" => {
                tools::parse::<tools::NoArgs>(name, arguments)?;
                Ok(agent.my_claims())
            }
            "who_holds" => agent.who_holds(tools::parse(name, arguments)?).await,
            "list_claims" => agent.list_claims(tools::parse(name, arguments)?).await,
            "write_value" => agent.write_value(tools::parse(name, arguments)?).await,
            "read_value" => agent.read_value(tools::parse(name, arguments)?).await,
            "add_task" => agent.add_task(tools::parse(name, arguments)?).await,
            "next_task" => agent.next_task(tools::parse(name, arguments)?).await,
            "complete_task" => agent.complete_task(tools::parse(name, arguments)?).await,
            "fail_task" => agent.fail_task(tools::parse(name, arguments)?).await,
            unknown => Err(McpError::invalid_params(
                format!(
                    "unknown tool `{unknown}`: the tools are {}",
                    self.tools
                        .iter()
                        .map(|tool| tool.name.as_ref())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None,
            )),
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

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let outcome = self.agent.announce(self.call(request).await?);
        let mut result = if outcome.is_error {
            CallToolResult::error(vec![ContentBlock::text(outcome.text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(outcome.text)])
        };
        result.structured_content = Some(outcome.structured);
        Ok(result.into())
    }
}
