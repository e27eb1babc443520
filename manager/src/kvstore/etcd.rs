//! [`Kv`] over etcd's v3 gRPC API (`etcd-client`). The client lives on a small runtime of its
//! own, so the synchronous seam can be called from anywhere (an API handler, a cluster thread)
//! without nesting runtimes; every call waits at most `timeout`, and a failure to connect or a
//! timeout is [`KvError::Unavailable`], which callers treat as retryable.

use std::path::PathBuf;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare as ECompare, CompareOp, ConnectOptions, EventType, GetOptions,
    Identity as TlsIdentity, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};

use super::{Compare, Entry, Event, Kv, KvError, LeaseId, Op, WatchReceiver};

/// TLS material for a secured cluster (all PEM files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA that signed the etcd servers' certificates.
    pub ca: Option<PathBuf>,
    /// Client certificate.
    pub cert: Option<PathBuf>,
    /// Client key.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// Any TLS option given?
    #[must_use]
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    fn options(&self) -> Result<TlsOptions, KvError> {
        let read = |p: &PathBuf, what: &'static str| {
            std::fs::read(p).map_err(|source| KvError::TlsFile {
                what,
                path: p.clone(),
                source,
            })
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca, "ca")?));
        }
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => {
                tls = tls.identity(TlsIdentity::from_pem(read(c, "cert")?, read(k, "key")?));
            }
            (None, None) => {}
            _ => return Err(KvError::TlsPair),
        }
        Ok(tls)
    }
}

/// The etcd-backed store.
pub struct EtcdKv {
    rt: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    options: ConnectOptions,
    client: Arc<Mutex<Option<Client>>>,
    timeout: Duration,
}

/// etcd's answer as a [`KvError`], by its gRPC code: etcd answers `NotFound` to a write or
/// revoke only for a missing lease (`ErrGRPCLeaseNotFound`).
fn classify(e: etcd_client::Error) -> KvError {
    use etcd_client::Error as E;
    match &e {
        E::GRpcStatus(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) =>
        {
            KvError::Unreachable(e)
        }
        E::GRpcStatus(s) if s.code() == tonic::Code::NotFound => KvError::LeaseNotFound(Some(e)),
        E::TransportError(_) => KvError::Unreachable(e),
        _ => KvError::Refused(e),
    }
}

impl EtcdKv {
    /// A store for `endpoints` (`http://host:port`, or `https://` with `tls`). Does not
    /// connect yet: the first call does, so a manager starts while etcd is down.
    pub fn new(endpoints: Vec<String>, tls: &TlsFiles, timeout: Duration) -> Result<Self, KvError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weft-etcd")
            .enable_all()
            .build()
            .map_err(KvError::Runtime)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout)
            .with_keep_alive_while_idle(true);
        if tls.any() {
            options = options.with_tls(tls.options()?);
        }
        Ok(Self {
            rt,
            endpoints,
            options,
            client: Arc::new(Mutex::new(None)),
            timeout,
        })
    }

    /// Runs `f` with a connected client on the store's runtime and waits for it, bounded.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, KvError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, KvError>> + Send,
    {
        let (tx, rx) = channel();
        let cached = self.client.clone();
        let endpoints = self.endpoints.clone();
        let options = self.options.clone();
        let timeout = self.timeout;
        self.rt.spawn(async move {
            let work = async {
                let existing = crate::sys::locks::lock(&cached).clone();
                let client = if let Some(c) = existing {
                    c
                } else {
                    let c = Client::connect(&endpoints, Some(options))
                        .await
                        .map_err(KvError::Unreachable)?;
                    *crate::sys::locks::lock(&cached) = Some(c.clone());
                    c
                };
                f(client).await
            };
            let result = tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| {
                    Err(KvError::Unavailable(format!(
                        "no answer within {timeout:?}"
                    )))
                });
            let _ = tx.send(result);
        });
        rx.recv_timeout(timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(KvError::Unavailable("etcd client did not answer".into())))
    }
}

fn entry(kv: &etcd_client::KeyValue) -> Entry {
    Entry {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    }
}

impl Kv for EtcdKv {
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
        let key = key.to_owned();
        self.run(move |mut c| async move {
            let resp = c.get(key, None).await.map_err(classify)?;
            Ok(resp.kvs().first().map(entry))
        })
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), KvError> {
        let prefix = prefix.to_owned();
        self.run(move |mut c| async move {
            let resp = c
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(classify)?;
            let rev = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            Ok((resp.kvs().iter().map(entry).collect(), rev))
        })
    }

    fn txn(&self, when: &[Compare], ops: &[Op]) -> Result<bool, KvError> {
        let compares: Vec<ECompare> = when
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => ECompare::create_revision(k.as_str(), CompareOp::Equal, 0),
                Compare::ValueIs(k, v) => ECompare::value(k.as_str(), CompareOp::Equal, v.clone()),
                Compare::ModRevisionIs(k, r) => {
                    ECompare::mod_revision(k.as_str(), CompareOp::Equal, *r)
                }
            })
            .collect();
        let txn_ops: Vec<TxnOp> = ops
            .iter()
            .map(|o| match o {
                Op::Put { key, value, lease } => TxnOp::put(
                    key.as_str(),
                    value.clone(),
                    lease.map(|l| PutOptions::new().with_lease(l)),
                ),
                Op::Delete(k) => TxnOp::delete(k.as_str(), None),
            })
            .collect();
        self.run(move |mut c| async move {
            let resp = c
                .txn(Txn::new().when(compares).and_then(txn_ops))
                .await
                .map_err(classify)?;
            Ok(resp.succeeded())
        })
    }

    fn grant_lease(&self, ttl_s: i64) -> Result<LeaseId, KvError> {
        self.run(move |mut c| async move {
            Ok(c.lease_grant(ttl_s, None).await.map_err(classify)?.id())
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<bool, KvError> {
        self.run(move |mut c| async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.map_err(classify)?;
            keeper.keep_alive().await.map_err(classify)?;
            match stream.message().await.map_err(classify)? {
                Some(resp) => Ok(resp.ttl() > 0),
                None => Err(KvError::Unavailable("keep-alive stream closed".into())),
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        self.run(move |mut c| async move {
            c.lease_revoke(lease).await.map_err(classify)?;
            Ok(())
        })
    }

    fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchReceiver, KvError> {
        let (tx, rx) = channel();
        let prefix = prefix.to_owned();
        let stream = self.run(move |mut c| async move {
            c.watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(from_revision),
                ),
            )
            .await
            .map_err(classify)
        })?;
        self.rt.spawn(async move {
            let mut stream = stream;
            loop {
                let err = match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        KvError::Unavailable(format!("watch cancelled: {}", resp.cancel_reason()))
                    }
                    Ok(Some(resp)) => {
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            let key = String::from_utf8_lossy(kv.key()).into_owned();
                            let event = match ev.event_type() {
                                EventType::Put => Event::Put(key, kv.value().to_vec()),
                                EventType::Delete => Event::Delete(key),
                            };
                            if tx.send(Ok(event)).is_err() {
                                return; // nobody listens any more
                            }
                        }
                        continue;
                    }
                    Ok(None) => KvError::Unavailable("watch stream closed".into()),
                    Err(e) => classify(e),
                };
                let _ = tx.send(Err(err));
                return;
            }
        });
        Ok(rx)
    }
}
