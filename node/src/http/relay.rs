//! The peer listener's routes of the write relay (`crate::service`'s relay.rs): `POST
//! /raft/relay` and `POST /raft/read-index`, each handing its body to the service and its
//! answer back as bytes.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::AppState;
use crate::service::{RelayRefused, READ_INDEX_PATH, RELAY_PATH};

/// The leader's side of the relay, to be mounted on the peer listener.
pub fn routes(app: AppState) -> Router {
    Router::new()
        .route(RELAY_PATH, post(serve_relay))
        .route(READ_INDEX_PATH, post(serve_read_index))
        .with_state(app)
}

async fn serve_read_index(State(app): State<AppState>) -> Response {
    bytes(app.serve_read_index().await)
}

async fn serve_relay(State(app): State<AppState>, body: Bytes) -> Response {
    match app.serve_relayed(&body).await {
        Ok(answers) => bytes(answers),
        Err(RelayRefused::Malformed(error)) => {
            tracing::warn!(%error, "refused a malformed relay message");
            (
                StatusCode::BAD_REQUEST,
                format!("malformed relay message: {error}"),
            )
                .into_response()
        }
        Err(RelayRefused::Internal(error)) => {
            tracing::error!(%error, "encoding a relay answer failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the answer failed",
            )
                .into_response()
        }
    }
}

fn bytes(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
}
