//! TLS plumbing shared by every HTTP and gRPC client and server: one rustls
//! crypto provider (ring) per process.

/// Installs the ring crypto provider for rustls once per process; every
/// rustls user here (LLM providers, JWKS fetches, mTLS) calls this first.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is installed already: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
