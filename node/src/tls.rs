//! TLS with rustls: the client API over HTTPS (`--tls-cert`, `--tls-key`) and mutual TLS
//! between peers (`--peer-tls-cert`, `--peer-tls-key`, `--peer-ca`), docs/security.md.
//! The handshakes themselves run in `connections.rs`, one per connection with a deadline, so
//! a client speaking plain HTTP to a TLS port, a peer without a certificate from the peer CA,
//! or a client that never finishes its handshake costs that one connection and nothing else.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

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
