//! TLS on a real cluster (docs/security.md): the client API over HTTPS and mutual TLS between
//! peers, with certificates the test makes (rcgen). HTTPS works from the CLI and the client
//! crate through every node; plain HTTP to a TLS port and a peer whose certificate another CA
//! signed are refused, and the node serves on.

use baton_client::api::ErrorCode;
use baton_tests::{Cluster, ClusterConfig, Method, TestCerts};
use serde_json::json;

use crate::cli::baton;

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
    let untrusted = baton(&all, &[&token, "--timeout=3s", "acquire", "tls/cli-2"]).await;
    untrusted.expect_code(1);

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
