//! One DNS request to one response: cluster names from the [`Zone`],
//! everything else from the upstreams, and SERVFAIL when neither can say.
//! hickory-server calls it for UDP and TCP alike and truncates UDP
//! responses to the client's payload size (setting TC).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::{
    BinDecoder, BinEncodable, BinEncoder, NameEncoding,
};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder, Queries};
use rand::seq::SliceRandom;

use super::upstream::Forwarder;
use super::zone::{Answer, Zone};

pub struct Handler {
    pub zone: Zone,
    pub forwarder: Forwarder,
    /// Set once both stores have their first full list: before that an
    /// empty store would deny names that exist, and clients would cache
    /// the NXDOMAIN.
    pub synced: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let edns = response_edns(request);
        let reencoded = reencoded(&request.queries);
        let queries = reencoded.as_ref().unwrap_or(&request.queries);
        let builder = MessageResponseBuilder::new(queries, edns.as_ref());
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = true;

        let query = match request.queries.queries() {
            [query] if request.metadata.op_code == OpCode::Query => query.original().clone(),
            [_] => return fail(&mut response, builder, metadata, ResponseCode::NotImp).await,
            _ => return fail(&mut response, builder, metadata, ResponseCode::FormErr).await,
        };

        match self.zone.answer(&query) {
            Answer::Local(_) if !self.synced.load(Ordering::Acquire) => {
                fail(&mut response, builder, metadata, ResponseCode::ServFail).await
            }
            Answer::Local(mut local) => {
                metadata.authoritative = true;
                metadata.response_code = local.rcode;
                // Clients mostly take the first address: shuffle so they
                // spread over a headless service's endpoints (CoreDNS's
                // `loadbalance`, in kubeadm's default Corefile).
                local.answers.shuffle(&mut rand::rng());
                let message = builder.build(
                    metadata,
                    local.answers.iter(),
                    None::<&Record>,
                    local.soa.iter(),
                    local.additionals.iter(),
                );
                send(&mut response, message).await
            }
            Answer::Forward => {
                let dnssec_ok = request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
                let forwarded = self
                    .forwarder
                    .forward(&query, request.metadata.recursion_desired, dnssec_ok)
                    .await;
                let Some(answer) = forwarded else {
                    return fail(&mut response, builder, metadata, ResponseCode::ServFail).await;
                };
                metadata.response_code = answer.metadata.response_code;
                metadata.authoritative = answer.metadata.authoritative;
                metadata.authentic_data = answer.metadata.authentic_data;
                metadata.recursion_available = answer.metadata.recursion_available;
                let message = builder.build(
                    metadata,
                    answer.answers.iter(),
                    answer.authorities.iter(),
                    None::<&Record>,
                    answer.additionals.iter(),
                );
                send(&mut response, message).await
            }
        }
    }
}

/// EDNS in the response when the request had it (RFC 6891 6.1.1), with the
/// client's payload size: hickory truncates UDP responses to it.
fn response_edns(request: &Request) -> Option<Edns> {
    let theirs = request.edns.as_ref()?;
    let mut edns = Edns::new();
    edns.set_max_payload(theirs.max_payload());
    edns.set_dnssec_ok(theirs.flags().dnssec_ok);
    Some(edns)
}

/// The question section written out again without compression, when the
/// request's own bytes hold a compression pointer; `None` otherwise.
///
/// hickory-server echoes the question bytes as received, and a pointer in
/// them points at offsets of the request: in the response it would read
/// whatever lies there (a pointer into the header reads header bits), an
/// answer the client cannot parse. Resolvers never compress a question,
/// so this only costs anything for odd or hostile requests.
fn reencoded(queries: &Queries) -> Option<Queries> {
    if !has_pointer(queries.as_bytes(), queries.len()) {
        return None;
    }
    let mut bytes = Vec::new();
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_name_encoding(NameEncoding::Uncompressed);
    for query in queries.queries() {
        query.emit(&mut encoder).ok()?;
    }
    Queries::read(&mut BinDecoder::new(&bytes), queries.len()).ok()
}

/// Whether any of the `count` questions in `section` ends in a
/// compression pointer (each name is labels up to the root or a pointer,
/// then type and class).
fn has_pointer(section: &[u8], count: usize) -> bool {
    let mut at = 0;
    for _ in 0..count {
        loop {
            let Some(&len) = section.get(at) else {
                return false;
            };
            if len & 0xc0 == 0xc0 {
                return true;
            }
            at += 1 + usize::from(len);
            if len == 0 {
                break;
            }
        }
        at += 4;
    }
    false
}

/// A response with `rcode` and no records.
async fn fail<R: ResponseHandler>(
    response: &mut R,
    builder: MessageResponseBuilder<'_>,
    mut metadata: Metadata,
    rcode: ResponseCode,
) -> ResponseInfo {
    metadata.response_code = rcode;
    send(response, builder.build_no_records(metadata)).await
}

async fn send<'a, R: ResponseHandler>(
    response: &mut R,
    message: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
) -> ResponseInfo {
    let fallback = Header {
        metadata: *message.metadata(),
        counts: HeaderCounts::default(),
    };
    match response.send_response(message).await {
        Ok(info) => info,
        Err(error) => {
            // The client went away, or the answer could not be encoded.
            tracing::debug!(%error, "cannot send DNS response");
            ResponseInfo::from(fallback)
        }
    }
}
