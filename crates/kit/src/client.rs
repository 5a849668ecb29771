//! Client side: channels to other services whose calls carry the correlation
//! id and trace context, and [`service_client!`](crate::service_client) for
//! clients that call a service in-process (dev mode) or over gRPC (split
//! mode) through the same methods.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Errors making a channel.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not a valid endpoint.
    #[error("invalid service url {url:?}: {reason}")]
    InvalidUrl {
        /// URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A token that cannot travel as a header value.
    #[error("the credential is empty or has characters other than visible ASCII")]
    InvalidCredential,
    /// Connecting failed.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// URL.
        url: String,
        /// Cause.
        source: tonic::transport::Error,
    },
}

fn endpoint(url: &str) -> Result<Endpoint, ClientError> {
    let url = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    Ok(Endpoint::from_shared(url.clone())
        .map_err(|e| ClientError::InvalidUrl {
            url: url.clone(),
            reason: e.to_string(),
        })?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true))
}

/// A channel that connects on first use and reconnects as needed.
pub fn lazy_channel(url: &str) -> Result<Channel, ClientError> {
    Ok(endpoint(url)?.connect_lazy())
}

/// A lazy channel to another Switchyard service: over TLS with `tls`
/// (this process's certificate: mTLS) when the URL is `https://`.
pub fn service_channel(
    url: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> Result<Channel, ClientError> {
    let mut e = endpoint(url)?;
    if url.starts_with("https://") {
        let tls = tls.cloned().unwrap_or_default();
        e = e.tls_config(tls).map_err(|err| ClientError::InvalidUrl {
            url: url.to_owned(),
            reason: err.to_string(),
        })?;
    }
    Ok(e.connect_lazy())
}

/// Lazy channels by endpoint, each made once and shared (clones share the
/// cache): for callers that reach many endpoints they learn at run time,
/// such as tool providers.
#[derive(Debug, Clone, Default)]
pub struct Channels(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Channel>>>);

impl Channels {
    /// The channel to `url`, made on first use.
    pub fn get(&self, url: &str) -> Result<Channel, ClientError> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = m.get(url) {
            return Ok(c.clone());
        }
        let c = lazy_channel(url)?;
        m.insert(url.to_owned(), c.clone());
        Ok(c)
    }
}

/// A channel connected now (fails fast when nothing listens).
pub async fn connect(url: &str) -> Result<Channel, ClientError> {
    endpoint(url)?
        .connect()
        .await
        .map_err(|source| ClientError::Connect {
            url: url.to_owned(),
            source,
        })
}

/// A bearer credential (API key, JWT or service token). Its `Debug` never
/// shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl Credential {
    /// `token` as an `authorization: Bearer …` value; refuses tokens that are
    /// not visible ASCII.
    pub fn bearer(token: &str) -> Result<Credential, ClientError> {
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::InvalidCredential);
        }
        format!("Bearer {token}")
            .parse()
            .map(Credential)
            .map_err(|_| ClientError::InvalidCredential)
    }
}

impl Credential {
    /// Puts the credential on `req` as its `authorization`: for a front
    /// door forwarding its caller's own credential, so the service called
    /// authenticates that caller, not the door.
    pub fn authorize<T>(&self, req: &mut tonic::Request<T>) {
        req.metadata_mut().insert("authorization", self.0.clone());
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential([redacted])")
    }
}

/// Interceptor adding `x-correlation-id`, `traceparent`, the caller's
/// credential and, when a service calls while serving a user, the user it
/// acts for (`x-switchyard-on-behalf-of`) to every call.
#[derive(Debug, Clone, Default)]
pub struct Propagate {
    credential: Option<Credential>,
    /// A service calling another Switchyard service: names the user it acts
    /// for. Never set on channels to agents or tools (third parties).
    service: bool,
}

impl Propagate {
    /// Calls authenticated with `credential` (none: anonymous).
    pub fn new(credential: Option<Credential>) -> Propagate {
        Propagate {
            credential,
            service: false,
        }
    }
}

impl tonic::service::Interceptor for Propagate {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        crate::context::inject(&mut req);
        let md = req.metadata_mut();
        if let Some(c) = &self.credential
            && !md.contains_key("authorization")
        {
            md.insert("authorization", c.0.clone());
        }
        if self.service
            && !md.contains_key(crate::auth::ON_BEHALF_HEADER)
            && let Some(user) = crate::context::outgoing_on_behalf()
            && let Ok(v) = user.encode().parse()
        {
            md.insert(crate::auth::ON_BEHALF_HEADER, v);
        }
        Ok(req)
    }
}

/// A channel with [`Propagate`] applied.
pub type Intercepted = InterceptedService<Channel, Propagate>;

/// `channel` with correlation, trace context and `credential` on every call.
pub fn authed(channel: Channel, credential: Option<Credential>) -> Intercepted {
    InterceptedService::new(channel, Propagate::new(credential))
}

/// A channel from one Switchyard service to another: `credential` (the
/// service token; none under mTLS, where the certificate is the
/// credential) and the user the current request or job acts for.
pub fn service(channel: Channel, credential: Option<Credential>) -> Intercepted {
    InterceptedService::new(
        channel,
        Propagate {
            credential,
            service: true,
        },
    )
}

/// A boxed future, as the erased in-process services of
/// [`service_client!`](crate::service_client) return.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Declares a client enum that calls a service either in-process or over
/// gRPC, with identical methods and behaviour. In-process calls go through the
/// same generated trait methods the gRPC server calls, with the correlation
/// context injected into the request metadata just as the interceptor does.
///
/// The in-process side is any implementation of the generated service trait,
/// behind an object-safe mirror of it (`$local`, declared here), so a client
/// is declared next to the proto types and never names the crate that
/// implements the service.
///
/// ```ignore
/// switchyard_kit::service_client! {
///     /// Registry client.
///     pub RegistryClient(LocalRegistry) {
///         service: RegistryService,
///         remote: RegistryServiceClient,
///         unary { register_agent(RegisterAgentRequest) -> RegisterAgentResponse; }
///         streaming { watch(WatchRequest) -> WatchResponse; }
///     }
/// }
/// ```
#[macro_export]
macro_rules! service_client {
    (
        $(#[$meta:meta])*
        $vis:vis $name:ident($local:ident) {
            service: $tr:path,
            remote: $remote:ident,
            unary { $( $(#[$um:meta])* $method:ident($req:ty) -> $resp:ty; )* }
            streaming { $( $(#[$sm:meta])* $smethod:ident($sreq:ty) -> $sresp:ty; )* }
        }
    ) => {
        #[doc = concat!("The in-process side of [`", stringify!($name), "`]: any implementation of the service trait.")]
        $vis trait $local: Send + Sync + 'static {
            $(
                #[doc = concat!("`", stringify!($method), "` in-process.")]
                fn $method(&self, req: ::tonic::Request<$req>)
                    -> $crate::client::BoxFuture<'_, ::std::result::Result<::tonic::Response<$resp>, ::tonic::Status>>;
            )*
            $(
                #[doc = concat!("`", stringify!($smethod), "` in-process.")]
                fn $smethod(&self, req: ::tonic::Request<$sreq>)
                    -> $crate::client::BoxFuture<'_, ::std::result::Result<$crate::BoxStream<$sresp>, ::tonic::Status>>;
            )*
        }

        impl<T: $tr> $local for T {
            $(
                fn $method(&self, req: ::tonic::Request<$req>)
                    -> $crate::client::BoxFuture<'_, ::std::result::Result<::tonic::Response<$resp>, ::tonic::Status>> {
                    <T as $tr>::$method(self, req)
                }
            )*
            $(
                fn $smethod(&self, req: ::tonic::Request<$sreq>)
                    -> $crate::client::BoxFuture<'_, ::std::result::Result<$crate::BoxStream<$sresp>, ::tonic::Status>> {
                    Box::pin(async move {
                        let stream = <T as $tr>::$smethod(self, req).await?.into_inner();
                        Ok(Box::pin(stream) as $crate::BoxStream<$sresp>)
                    })
                }
            )*
        }

        $(#[$meta])*
        #[derive(Clone)]
        $vis enum $name {
            /// The service in this process.
            Local(::std::sync::Arc<dyn $local>),
            /// The service over gRPC.
            Remote($remote<$crate::client::Intercepted>),
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self {
                    Self::Local(_) => f.write_str(concat!(stringify!($name), "::Local")),
                    Self::Remote(_) => f.write_str(concat!(stringify!($name), "::Remote")),
                }
            }
        }

        impl $name {
            /// A client calling the in-process service.
            pub fn local(svc: ::std::sync::Arc<impl $local>) -> Self {
                Self::Local(svc)
            }

            /// A client calling over `channel` (see [`authed`](crate::client::authed)),
            /// propagating correlation and the caller's credential.
            pub fn remote(channel: $crate::client::Intercepted, max_message_bytes: usize) -> Self {
                Self::Remote(
                    $remote::new(channel)
                        .max_decoding_message_size(max_message_bytes)
                        .max_encoding_message_size(max_message_bytes),
                )
            }

            /// Whether calls stay in this process.
            pub fn is_local(&self) -> bool {
                matches!(self, Self::Local(_))
            }

            $(
                $(#[$um])*
                pub async fn $method(&self, req: $req) -> ::std::result::Result<$resp, ::tonic::Status> {
                    let mut req = ::tonic::Request::new(req);
                    $crate::context::inject(&mut req);
                    match self {
                        Self::Local(svc) => {
                            req.extensions_mut().insert($crate::context::local_principal());
                            svc.$method(req).await.map(|r| r.into_inner())
                        }
                        Self::Remote(c) => c.clone().$method(req).await.map(|r| r.into_inner()),
                    }
                }
            )*

            $(
                $(#[$sm])*
                pub async fn $smethod(&self, req: $sreq) -> ::std::result::Result<$crate::BoxStream<$sresp>, ::tonic::Status> {
                    let mut req = ::tonic::Request::new(req);
                    $crate::context::inject(&mut req);
                    match self {
                        Self::Local(svc) => {
                            req.extensions_mut().insert($crate::context::local_principal());
                            svc.$smethod(req).await
                        }
                        Self::Remote(c) => Ok(Box::pin(c.clone().$smethod(req).await?.into_inner())),
                    }
                }
            )*
        }
    };
}
