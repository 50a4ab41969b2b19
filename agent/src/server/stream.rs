//! `/exec`, `/attach` and `/portForward`: the CRI streaming calls, with the
//! caller's HTTP upgrade passed through to the runtime's streaming server.

use axum::Router;

use super::readonly::ServerState;

pub fn routes(state: ServerState) -> Router {
    Router::new().with_state(state)
}
