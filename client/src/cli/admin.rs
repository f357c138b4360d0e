//! `baton token` and `baton limits`: the admin calls of access control (docs/security.md).

use baton_client::api::{CreateTokenRequest, TokenInfo, TokenQuotas, TokenRole};
use baton_client::Client;
use serde_json::Value;

use super::output::{note, print_json, say, Failure, EXIT_OK};
use super::{LimitsCommand, TokenCommand, TokenRoleArg};

pub async fn token(client: &Client, command: TokenCommand, json: bool) -> Result<u8, Failure> {
    match command {
        TokenCommand::Create {
            name,
            role,
            namespaces,
            sessions_max,
            leases_max,
        } => {
            let request = CreateTokenRequest {
                name,
                role: match role {
                    TokenRoleArg::Reader => TokenRole::Reader,
                    TokenRoleArg::Agent => TokenRole::Agent,
                    TokenRoleArg::Admin => TokenRole::Admin,
                },
                namespaces,
                quotas: (sessions_max.is_some() || leases_max.is_some()).then_some(TokenQuotas {
                    sessions_max,
                    leases_max,
                }),
            };
            let created = client.create_token(&request).await?;
            if json {
                print_json(&created);
            } else {
                // The secret alone on stdout, so `export BATON_TOKEN=$(baton token create ...)`
                // works; what it is goes to stderr.
                note!(
                    "created token {}: keep this secret, it is not shown again",
                    describe(&created.token)
                );
                say!("{}", created.secret);
            }
        }
        TokenCommand::List => {
            let list = client.list_tokens().await?;
            if json {
                print_json(&list);
            } else {
                for token in &list.tokens {
                    say!("{}", describe(token));
                }
            }
        }
        TokenCommand::Revoke { name } => {
            let revoked = client.revoke_token(&name).await?;
            if json {
                print_json(&revoked);
            } else {
                say!("revoked token {}", revoked.name);
            }
        }
    }
    Ok(EXIT_OK)
}

/// `team-a role=agent namespaces=team-a,shared created 2026-12-02T01:33:49Z`.
fn describe(token: &TokenInfo) -> String {
    let role = match token.role {
        TokenRole::Reader => "reader",
        TokenRole::Agent => "agent",
        TokenRole::Admin => "admin",
    };
    let mut quotas = String::new();
    if let Some(sessions_max) = token.quotas.sessions_max {
        quotas += &format!(" sessions_max={sessions_max}");
    }
    if let Some(leases_max) = token.quotas.leases_max {
        quotas += &format!(" leases_max={leases_max}");
    }
    format!(
        "{} role={role} namespaces={}{quotas} created {}",
        token.name,
        token.namespaces.join(","),
        token.created_at
    )
}

pub async fn limits(client: &Client, command: LimitsCommand, json: bool) -> Result<u8, Failure> {
    let limits = match command {
        LimitsCommand::Get => client.limits().await?,
        LimitsCommand::Set { changes } => {
            let changes = changes
                .into_iter()
                .map(|(name, value)| (name, Value::from(value)))
                .collect();
            client.set_limits(&changes).await?
        }
    };
    if json {
        print_json(&limits);
    } else if let Value::Object(limits) = &limits {
        for (name, value) in limits {
            say!("{name}={value}");
        }
    }
    Ok(EXIT_OK)
}
