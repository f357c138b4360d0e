//! TLS with rustls: the client API over HTTPS (`--tls-cert`, `--tls-key`) and mutual TLS
//! between peers (`--peer-tls-cert`, `--peer-tls-key`, `--peer-ca`), docs/security.md.
//!
//! A listener hands axum only connections whose handshake finished; each handshake runs in its
//! own task with a deadline, so a client speaking plain HTTP to a TLS port, a peer without a
//! certificate from the peer CA, or a client that never finishes its handshake costs that one
//! connection and nothing else.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The longest a connection may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for axum to take them.
const ACCEPTED_QUEUE: usize = 128;

/// A certificate chain and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !certificates.is_empty(),
        "{} holds no certificate",
        path.display()
    );
    Ok(certificates)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("{} is not a PEM private key", path.display()))
}

/// The trust roots in a PEM file of CA certificates.
pub fn roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path)? {
        roots
            .add(certificate)
            .with_context(|| format!("{} holds an unusable CA certificate", path.display()))?;
    }
    Ok(roots)
}

/// A server configuration for `identity`; with `client_ca`, clients must present a
/// certificate that CA signed (mutual TLS, for the peer port).
pub fn server_config(
    identity: &Identity,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .context("the peer CA cannot verify client certificates")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certificates(&identity.cert)?, private_key(&identity.key)?)
        .with_context(|| not_a_pair(identity))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client side of peer TLS: trusts only the peer CA `ca` and shows `identity` (mutual TLS,
/// for connections to other nodes' peer ports).
pub fn client_config(identity: &Identity, ca: &Path) -> anyhow::Result<Arc<ClientConfig>> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots(ca)?)
        .with_client_auth_cert(certificates(&identity.cert)?, private_key(&identity.key)?)
        .with_context(|| not_a_pair(identity))?;
    Ok(Arc::new(config))
}

fn not_a_pair(identity: &Identity) -> String {
    format!(
        "{} and {} are not a certificate and its key",
        identity.cert.display(),
        identity.key.display()
    )
}

/// A TCP listener that yields TLS connections whose handshake is done.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` in a task of its own, one handshake task per connection.
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        port: &'static str,
    ) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (sender, accepted) = mpsc::channel(ACCEPTED_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            while !sender.is_closed() {
                let (stream, peer) = match tcp.accept().await {
                    Ok(connection) => connection,
                    Err(error) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(%error, port, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::info!(%peer, %error, port, "TLS handshake refused");
                        }
                        Err(_) => tracing::info!(%peer, port, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { accepted, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The accept task only ends when this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
