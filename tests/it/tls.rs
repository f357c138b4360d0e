//! TLS on a real cluster (docs/security.md): the client API over HTTPS and mutual TLS between
//! peers, with certificates the test makes (rcgen). HTTPS works from the CLI and the client
//! crate through every node; plain HTTP to a TLS port and a peer whose certificate another CA
//! signed are refused, and the node serves on. A certificate the client cannot accept is a
//! configuration error: never retried, exit 2, and the message says what to fix.

use std::time::{Duration, Instant};

use baton_client::api::ErrorCode;
use baton_tests::{poll_until, Cluster, ClusterConfig, Method, TestCerts};
use serde_json::{json, Value};

use crate::cli::baton;
use crate::hook::{bytes, denial, HookWorld};

const BOOTSTRAP: &str = "bootstrap-secret-for-tls-tests-1";

struct Secured {
    cluster: Cluster,
    certs: TestCerts,
    // Declared last: the certificates outlive the nodes that read them.
    _dir: tempfile::TempDir,
}

async fn secured(nodes: u64) -> Secured {
    let dir = tempfile::tempdir().expect("a directory for certificates");
    let certs = TestCerts::generate(dir.path(), "cluster", &[]);
    let cluster = Cluster::start_with(ClusterConfig {
        bootstrap_token: Some(BOOTSTRAP.to_owned()),
        tls: Some(certs.clone()),
        ..ClusterConfig::new(nodes)
    })
    .await;
    Secured {
        cluster,
        certs,
        _dir: dir,
    }
}

#[tokio::test]
async fn https_with_the_clusters_ca_works_from_the_cli_and_the_client_crate() {
    let Secured {
        cluster,
        certs,
        _dir,
    } = secured(3).await;
    let endpoints: Vec<String> = cluster.nodes().iter().map(|node| node.api_url()).collect();
    assert!(endpoints.iter().all(|url| url.starts_with("https://")));

    // The client crate, through every node (followers forward to the leader over HTTPS).
    for (index, endpoint) in endpoints.iter().enumerate() {
        let client = baton_client::Client::builder([endpoint.as_str()])
            .token(BOOTSTRAP)
            .ca_certificates(certs.ca_pem())
            .holder("tls-client")
            .build()
            .unwrap();
        let guard = client
            .acquire(&format!("tls/node-{index}"), Default::default())
            .await
            .unwrap_or_else(|error| panic!("acquire through {endpoint}: {error}"));
        guard.release().await.unwrap();
    }
    // Without the CA, the certificate is not trusted: nothing is sent.
    let untrusting = baton_client::Client::builder([endpoints[0].as_str()])
        .token(BOOTSTRAP)
        .attempts_max(1)
        .build()
        .unwrap();
    assert!(untrusting.kv_put("k", json!(1)).await.is_err());

    // The CLI with --ca-file.
    let ca = format!("--ca-file={}", certs.ca.display());
    let token = format!("--token={BOOTSTRAP}");
    let all = endpoints.join(",");
    let acquired = baton(&all, &[&ca, &token, "acquire", "tls/cli"]).await;
    acquired.expect_code(0);
    // Without it: a configuration error, said as such, not an unreachable cluster.
    let untrusted = baton(&all, &[&token, "--timeout=3s", "acquire", "tls/cli-2"]).await;
    untrusted.expect_code(2);
    assert!(
        untrusted.error_line().starts_with("error[TLS]: ")
            && untrusted.error_line().contains("--ca-file"),
        "{untrusted:#?}"
    );

    // Plain HTTP to the TLS port: refused, and the node serves on.
    let node = cluster.node(1);
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(
        plain
            .get(format!("http://{}/v1/cluster", node.api_addr()))
            .send()
            .await
            .is_err(),
        "a plaintext request got an answer"
    );
    cluster
        .api()
        .get(node, "/v1/cluster")
        .await
        .expect_status(200);
    cluster
        .api()
        .call(Method::GET, node, "/v1/leases")
        .token(None)
        .send()
        .await
        .expect_problem(401, ErrorCode::Unauthenticated);
}

#[tokio::test]
async fn a_peer_without_a_certificate_from_the_peer_ca_is_refused() {
    let Secured {
        cluster,
        certs,
        _dir,
    } = secured(1).await;
    let node = cluster.node(1);
    let vote = format!("https://{}/raft/vote", node.peer_addr());
    let trusting = |builder: reqwest::ClientBuilder| {
        builder
            .no_proxy()
            .tls_certs_only([reqwest::Certificate::from_pem(&certs.ca_pem()).unwrap()])
    };
    let identity = |certs: &TestCerts| {
        let mut pem = std::fs::read(&certs.cert).unwrap();
        pem.extend(std::fs::read(&certs.key).unwrap());
        reqwest::Identity::from_pem(&pem).unwrap()
    };

    // No client certificate: the handshake fails.
    let anonymous = trusting(reqwest::Client::builder()).build().unwrap();
    assert!(anonymous.post(&vote).body(vec![0]).send().await.is_err());
    // A certificate another CA signed: the handshake fails too.
    let other = TestCerts::generate(_dir.path(), "intruder", &[]);
    let intruder = trusting(reqwest::Client::builder())
        .identity(identity(&other))
        .build()
        .unwrap();
    assert!(intruder.post(&vote).body(vec![0]).send().await.is_err());
    // The cluster's own certificate gets through TLS (and then an HTTP answer: the garbage
    // body is refused by the peer API, not by TLS).
    let member = trusting(reqwest::Client::builder())
        .identity(identity(&certs))
        .build()
        .unwrap();
    let answer = member.post(&vote).body(vec![0]).send().await.unwrap();
    assert!(answer.status().is_client_error(), "{}", answer.status());

    // The node serves on.
    cluster.api().get(node, "/readyz").await.expect_status(200);
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("TLS handshake refused"),
        "the refusals are logged"
    );
}

#[tokio::test]
async fn a_ca_certificate_served_as_the_servers_is_a_configuration_error_said_at_once() {
    let Secured {
        cluster,
        certs,
        _dir,
    } = secured(1).await;
    // What `openssl req -x509` makes by default: the CA certificate itself, served.
    let node = cluster.node(1);
    node.kill();
    std::fs::copy(&certs.ca, &certs.cert).expect("serve the CA certificate");
    std::fs::copy(&certs.ca_key, &certs.key).expect("with the CA's key");
    node.restart();
    let address = node.api_addr();
    poll_until(
        Duration::from_secs(20),
        "the node to listen again",
        async || {
            tokio::net::TcpStream::connect(&address)
                .await
                .ok()
                .map(drop)
        },
    )
    .await;

    let ca = format!("--ca-file={}", certs.ca.display());
    let token = format!("--token={BOOTSTRAP}");
    let started = Instant::now();
    let refused = baton(&node.api_url(), &[&ca, &token, "acquire", "tls/ca"]).await;
    let took = started.elapsed();
    refused.expect_code(2);
    let line = refused.error_line();
    assert!(
        line.starts_with("error[TLS]: ")
            && line.contains("is a CA certificate")
            && line.contains("docs/security.md"),
        "{refused:#?}"
    );
    // Not retried: one attempt, no backoff (eight attempts take more than three seconds).
    assert!(!line.contains("attempt"), "{refused:#?}");
    assert!(took < Duration::from_secs(3), "took {took:?}: {refused:#?}");

    // The client crate says the same, as an error that was surely not applied.
    let client = baton_client::Client::builder([node.api_url()])
        .token(BOOTSTRAP)
        .ca_certificates(certs.ca_pem())
        .build()
        .expect("a client");
    let error = client
        .kv_put("tls/ca", json!(1))
        .await
        .expect_err("a CA certificate is refused");
    assert_eq!(error.code(), "TLS", "{error:?}");
    assert!(!error.is_indeterminate(), "{error:?}");

    // The hook denies, even with --fail-open: this is configuration, not an outage.
    let world = HookWorld::new();
    let edit = world.pre_tool_use("tlstlstl-1", "Edit", "src/auth.rs");
    let hooked = world
        .hook(
            &node.api_url(),
            &[&ca, &token, "--fail-open"],
            &bytes(&edit),
        )
        .await;
    let reason = denial(&hooked);
    assert!(
        reason.starts_with(
            "github.com/acme/web/src/auth.rs cannot be claimed: Baton's TLS setup is wrong"
        ) && reason.contains("is a CA certificate"),
        "{hooked:#?}"
    );

    // The MCP server answers a tool call with an error result that says the same.
    let mut mcp = tokio::process::Command::new(baton_tests::baton_path());
    mcp.args(["mcp", "--endpoints", &node.api_url(), &ca, &token])
        .env_remove("BATON_ENDPOINTS")
        .kill_on_drop(true);
    let (transport, _) = rmcp::transport::TokioChildProcess::builder(mcp)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn baton mcp");
    let agent = rmcp::ServiceExt::serve((), transport)
        .await
        .expect("the MCP handshake");
    let Value::Object(arguments) = json!({"resource": "tls/mcp"}) else {
        unreachable!()
    };
    let claimed = agent
        .call_tool(rmcp::model::CallToolRequestParams::new("claim").with_arguments(arguments))
        .await
        .expect("a tool result");
    assert_eq!(claimed.is_error, Some(true), "{claimed:?}");
    let text = format!("{:?}", claimed.content);
    assert!(
        text.contains("TLS setup is fixed") && text.contains("is a CA certificate"),
        "{text}"
    );
    agent.cancel().await.expect("close the MCP session");
}
