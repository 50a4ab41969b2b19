//! etcd v3 backend: keys and revisions map one to one onto etcd's, writes
//! are single transactions that compare revisions, watches are etcd watches,
//! TTLs are leases (shared, see [`leases`](super::leases)).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, CompactionOptions, Compare, CompareOp, ConnectOptions, GetOptions,
    Identity, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::io::AsyncWriteExt;

use super::leases::{grant_seconds, Leases};
use super::{Error, Event, KeyValue, ListResult, Result, SnapshotInfo, Store, WatchStream};

const BACKEND: &str = "etcd";

/// Client TLS towards etcd: the CA its members' certificates chain to,
/// and the certificate this server presents (`--datastore-cafile`,
/// `--datastore-certfile`, `--datastore-keyfile`, or a managed member's
/// files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Tls {
    /// The files, read, as the client's options.
    ///
    /// # Errors
    /// `Backend` naming the file that cannot be read.
    pub fn options(&self) -> Result<TlsOptions> {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| Error::backend_source(BACKEND, format!("reading {}", p.display()), e))
        };
        Ok(TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca)?))
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?)))
    }
}

/// The etcd store. Cheap to clone (one multiplexed gRPC channel).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    /// The lease writes with a TTL share (all clones share it).
    leases: Arc<Leases>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

pub(super) fn etcd_err(context: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
    let context = context.into();
    move |e| Error::backend_source(BACKEND, format!("{context}: {e}"), e)
}

fn kv_of(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    }
}

fn header_rev(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision())
}

/// etcd reports these as gRPC status messages.
fn is_compacted(e: &etcd_client::Error) -> bool {
    e.to_string()
        .contains("required revision has been compacted")
}

/// The member cannot serve for now (a leader election, a partition): a
/// read may be asked again, as Go's client does for read-only calls.
fn is_unavailable(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable)
}

/// Pauses between asking a read again while etcd is unavailable: about
/// two election timeouts in all.
const READ_RETRIES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(600),
    Duration::from_millis(1000),
];

/// A refusal this quick is an election under way, not a lost quorum.
const QUICK_REFUSAL: Duration = Duration::from_millis(500);

fn is_future(e: &etcd_client::Error) -> bool {
    e.to_string()
        .contains("required revision is a future revision")
}

/// The range end covering every key that starts with `prefix` (etcd's
/// convention: `\0` means "to the end").
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdStore {
    /// Connect to an etcd cluster (`http://host:port` endpoints; the client
    /// balances between them and fails over when one goes away).
    ///
    /// # Errors
    /// `Backend` when no endpoint can be reached.
    pub async fn connect(endpoints: &[String]) -> Result<EtcdStore> {
        EtcdStore::connect_tls(endpoints, None).await
    }

    /// [`EtcdStore::connect`] over mutual TLS (`https://` endpoints).
    ///
    /// # Errors
    /// `Backend` when a TLS file cannot be read or no endpoint can be
    /// reached.
    pub async fn connect_tls(endpoints: &[String], tls: Option<&Tls>) -> Result<EtcdStore> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(15))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = tls {
            opts = opts.with_tls(tls.options()?);
        }
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(etcd_err(format!("connect to {}", endpoints.join(","))))?;
        Ok(EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
            leases: Arc::default(),
        })
    }

    /// Put options for a write: with a lease living about `ttl` when given
    /// (reused from a recent write when one fits), else none (a put
    /// without a lease detaches the key from the one it had).
    async fn put_options(&self, key: &str, ttl: Option<Duration>) -> Result<PutOptions> {
        let Some(ttl) = ttl else {
            return Ok(PutOptions::new());
        };
        let now = Instant::now();
        let id = match self.leases.reusable(ttl, now) {
            Some(id) => id,
            None => {
                let secs = grant_seconds(ttl);
                let mut c = self.client.clone();
                let id = c
                    .lease_grant(secs, None)
                    .await
                    .map_err(etcd_err(format!("grant a {secs}s lease for {key}")))?
                    .id();
                self.leases.granted(id, secs, now);
                id
            }
        };
        Ok(PutOptions::new().with_lease(id))
    }

    /// A read, asked again while etcd elects a leader: only after quick
    /// refusals (`leader changed`), not after one that took its time
    /// (`request timed out`: no quorum), which would only add up.
    async fn read(
        &self,
        key: impl Into<Vec<u8>> + Clone,
        opts: Option<GetOptions>,
    ) -> std::result::Result<etcd_client::GetResponse, etcd_client::Error> {
        let mut c = self.client.clone();
        for pause in READ_RETRIES {
            let asked = Instant::now();
            match c.get(key.clone(), opts.clone()).await {
                Err(e) if is_unavailable(&e) && asked.elapsed() < QUICK_REFUSAL => {
                    tokio::time::sleep(pause).await;
                }
                done => return done,
            }
        }
        c.get(key, opts).await
    }

    /// The latest revision and the current value (if any) of `key`.
    async fn current(&self, key: &str) -> Result<(i64, Option<KeyValue>)> {
        let resp = self
            .read(key, None)
            .await
            .map_err(etcd_err(format!("get {key}")))?;
        Ok((header_rev(resp.header()), resp.kvs().first().map(kv_of)))
    }

    /// Run a compare-and-put/delete transaction whose else branch reads the
    /// key back; returns the response or the key's current state.
    async fn txn(&self, key: &str, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse> {
        let mut c = self.client.clone();
        c.txn(txn).await.map_err(etcd_err(format!("{what} {key}")))
    }
}

/// The key as read by the else branch of a failed transaction.
/// Why a compare-and-swap transaction failed: the key is gone, or its
/// revision moved (the else branch read it back).
fn cas_failure(key: &str, resp: &etcd_client::TxnResponse, expected: i64) -> Error {
    match else_kv(resp) {
        None => Error::NotFound {
            key: key.to_string(),
        },
        Some(kv) => Error::Conflict {
            key: key.to_string(),
            expected,
            actual: kv.mod_revision,
        },
    }
}

fn else_kv(resp: &etcd_client::TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(kv_of),
        _ => None,
    })
}

fn put_prev(resp: &etcd_client::TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Put(p) => p.prev_key().map(kv_of),
        _ => None,
    })
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn current_revision(&self) -> Result<i64> {
        // A count-only read of one key: cheap, and linearizable.
        let resp = self
            .read("/", Some(GetOptions::new().with_count_only()))
            .await
            .map_err(etcd_err("read current revision"))?;
        Ok(header_rev(resp.header()))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.current(key).await?.1)
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> Result<ListResult> {
        // Strictly after `start_after`: the smallest key above it is it + "\0".
        let start = match start_after {
            Some(a) if a >= prefix => {
                let mut k = a.as_bytes().to_vec();
                k.push(0);
                k
            }
            // etcd rejects an empty key: "\0" is the smallest one.
            _ if prefix.is_empty() => vec![0],
            _ => prefix.as_bytes().to_vec(),
        };
        let mut opts = GetOptions::new().with_range(range_end(prefix));
        if limit > 0 {
            opts = opts.with_limit(limit as i64);
        }
        let rev = revision.filter(|r| *r > 0);
        if let Some(r) = rev {
            opts = opts.with_revision(r);
        }
        match self.read(start, Some(opts)).await {
            Ok(resp) => Ok(ListResult {
                kvs: resp.kvs().iter().map(kv_of).collect(),
                // The header carries the newest revision, not the one read.
                revision: rev.unwrap_or_else(|| header_rev(resp.header())),
                more: resp.more(),
            }),
            Err(e) if is_compacted(&e) => {
                // etcd does not say how far it compacted.
                Err(Error::Compacted {
                    requested: rev.unwrap_or_default(),
                    compacted: 0,
                })
            }
            Err(e) if is_future(&e) => Err(Error::FutureRevision {
                requested: rev.unwrap_or_default(),
                current: self.current_revision().await?,
            }),
            Err(e) => Err(etcd_err(format!("list {prefix}"))(e)),
        }
    }

    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        let opts = self.put_options(key, ttl).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.clone(), Some(opts))]);
        let resp = self.txn(key, "create", txn).await?;
        if !resp.succeeded() {
            return Err(Error::AlreadyExists {
                key: key.to_string(),
            });
        }
        let rev = header_rev(resp.header());
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision: rev,
            mod_revision: rev,
        })
    }

    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        let opts = self.put_options(key, ttl).await?.with_prev_key();
        // Inside the compare-and-swap, a nested transaction (etcd 3.3+)
        // writes only when the value differs: the same bytes read the key
        // back instead (upstream's GuaranteedUpdate short-circuit, here
        // atomic with the revision check and in one round trip).
        let put_if_changed = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, value.clone())])
            .and_then([TxnOp::get(key, None)])
            .or_else([TxnOp::put(key, value.clone(), Some(opts))]);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Greater, 0),
                Compare::mod_revision(key, CompareOp::Equal, expected_revision),
            ])
            .and_then([TxnOp::txn(put_if_changed)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(key, "update", txn).await?;
        if !resp.succeeded() {
            return Err(cas_failure(key, &resp, expected_revision));
        }
        // Nested responses carry no header: the revision is the outer one's.
        let rev = header_rev(resp.header());
        let Some(inner) = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        }) else {
            return Err(Error::backend(
                BACKEND,
                format!("update {key}: etcd answered without the nested transaction"),
            ));
        };
        if inner.succeeded() {
            return else_kv(&inner).ok_or_else(|| {
                Error::backend(
                    BACKEND,
                    format!("update {key}: etcd read back no value for an unchanged key"),
                )
            });
        }
        let create_revision = put_prev(&inner).map_or(rev, |p| p.create_revision);
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision,
            mod_revision: rev,
        })
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let mut when = vec![Compare::create_revision(key, CompareOp::Greater, 0)];
        if let Some(e) = expected_revision {
            when.push(Compare::mod_revision(key, CompareOp::Equal, e));
        }
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::delete(
                key,
                Some(etcd_client::DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(key, "delete", txn).await?;
        if !resp.succeeded() {
            return Err(cas_failure(
                key,
                &resp,
                expected_revision.unwrap_or_default(),
            ));
        }
        let rev = header_rev(resp.header());
        let prev = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Delete(d) => d.prev_kvs().first().map(kv_of),
            _ => None,
        });
        let prev = prev.ok_or_else(|| {
            Error::backend(
                BACKEND,
                format!("delete {key}: etcd returned no previous value"),
            )
        })?;
        Ok((prev, rev))
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        let start = after_revision.max(0) + 1;
        // etcd answers a compacted start revision only inside the stream;
        // a read at that revision tells up front (a future one is fine).
        let mut c = self.client.clone();
        let probe = GetOptions::new().with_count_only().with_revision(start);
        match c.get("/", Some(probe)).await {
            Err(e) if is_compacted(&e) => {
                return Err(Error::Compacted {
                    requested: after_revision,
                    compacted: 0,
                })
            }
            Err(e) if is_future(&e) => {}
            Err(e) => return Err(etcd_err(format!("watch {prefix}"))(e)),
            Ok(_) => {}
        }
        let mut opts = WatchOptions::new()
            .with_start_revision(start)
            .with_prev_key();
        opts = if prefix.is_empty() {
            opts.with_all_keys()
        } else {
            opts.with_prefix()
        };
        let stream = c
            .watch(prefix, Some(opts))
            .await
            .map_err(etcd_err(format!("watch {prefix}")))?;
        let prefix = prefix.to_string();
        let state = (
            stream,
            std::collections::VecDeque::<Result<Event>>::new(),
            false,
        );
        Ok(Box::pin(futures::stream::unfold(
            state,
            move |(mut stream, mut pending, mut done)| {
                let prefix = prefix.clone();
                async move {
                    loop {
                        if let Some(item) = pending.pop_front() {
                            return Some((item, (stream, pending, done)));
                        }
                        if done {
                            return None;
                        }
                        match stream.message().await {
                            Ok(Some(resp)) => {
                                if resp.compact_revision() > 0 {
                                    pending.push_back(Err(Error::Compacted {
                                        requested: start - 1,
                                        compacted: resp.compact_revision(),
                                    }));
                                    done = true;
                                    continue;
                                }
                                if resp.canceled() {
                                    pending.push_back(Err(Error::backend(
                                        BACKEND,
                                        format!(
                                            "watch {prefix} canceled: {}",
                                            resp.cancel_reason()
                                        ),
                                    )));
                                    done = true;
                                    continue;
                                }
                                for ev in resp.events() {
                                    pending.push_back(map_event(ev, &prefix));
                                }
                            }
                            Ok(None) => return None,
                            Err(e) => {
                                pending.push_back(Err(etcd_err(format!("watch {prefix}"))(e)));
                                done = true;
                            }
                        }
                    }
                }
            },
        )))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let mut c = self.client.clone();
        match c
            .compact(revision, Some(CompactionOptions::new().with_physical()))
            .await
        {
            Ok(_) => Ok(()),
            // Compacting to an older point than the current one is a no-op.
            Err(e) if is_compacted(&e) => Ok(()),
            Err(e) if is_future(&e) => Err(Error::FutureRevision {
                requested: revision,
                current: self.current_revision().await?,
            }),
            Err(e) => Err(etcd_err(format!("compact to revision {revision}"))(e)),
        }
    }

    async fn health(&self) -> Result<()> {
        // A linearizable read needs a leader and a quorum: what "ready" means.
        self.current_revision().await.map(|_| ())
    }

    async fn snapshot_save(&self, path: &Path) -> Result<SnapshotInfo> {
        let what = format!("save etcd snapshot to {}", path.display());
        let tmp = super::snapshot::temp_path(path);
        let io = |e: std::io::Error| Error::backend_source(BACKEND, format!("{what}: {e}"), e);
        let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
        let mut c = self.client.clone();
        let mut stream = c.snapshot().await.map_err(etcd_err(what.clone()))?;
        while let Some(chunk) = stream.message().await.map_err(etcd_err(what.clone()))? {
            file.write_all(chunk.blob()).await.map_err(io)?;
        }
        file.flush().await.map_err(io)?;
        drop(file);
        let (t, p) = (tmp.clone(), path.to_path_buf());
        tokio::task::spawn_blocking(move || super::snapshot::persist(&t, &p))
            .await
            .map_err(|e| Error::backend(BACKEND, format!("{what}: task failed: {e}")))??;
        super::snapshot::snapshot_status(path).await
    }
}

fn map_event(ev: &etcd_client::Event, prefix: &str) -> Result<Event> {
    let kv = ev.kv().map(kv_of).ok_or_else(|| {
        Error::backend(
            BACKEND,
            format!("watch {prefix}: event without a key-value"),
        )
    })?;
    let prev = ev.prev_kv().map(kv_of);
    Ok(match ev.event_type() {
        etcd_client::EventType::Put => {
            // A create has no previous value (etcd may still send the
            // tombstoned one's absence as None).
            let prev = if kv.create_revision == kv.mod_revision {
                None
            } else {
                prev
            };
            Event::Put { kv, prev }
        }
        etcd_client::EventType::Delete => {
            let revision = kv.mod_revision;
            let prev = prev.unwrap_or(KeyValue {
                key: kv.key,
                value: Vec::new(),
                create_revision: 0,
                mod_revision: 0,
            });
            Event::Delete { prev, revision }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::range_end;

    #[test]
    fn range_end_of_prefix() {
        assert_eq!(range_end("/registry/pods/"), b"/registry/pods0".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }
}
