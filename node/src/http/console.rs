//! The operator console at `/ui`: a read-only page for the people who run a fleet, whose
//! assets (`node/console/`) are compiled into the binary. It is served by every node itself
//! (never forwarded), without a token: the page asks for one when the cluster wants it, and
//! its own requests go through the public API like any client's.
//!
//! Each asset is answered with its content type, an `ETag` (the SHA-256 of its bytes) and
//! `Cache-Control: no-cache`, so a browser keeps it but asks again, and a `304` costs no body.

use std::sync::OnceLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use super::AppState;

/// One embedded file: its bytes, content type and entity tag.
struct Asset {
    bytes: &'static [u8],
    content_type: &'static str,
    etag: OnceLock<HeaderValue>,
}

impl Asset {
    const fn new(bytes: &'static [u8], content_type: &'static str) -> Asset {
        Asset {
            bytes,
            content_type,
            etag: OnceLock::new(),
        }
    }

    fn etag(&self) -> &HeaderValue {
        self.etag.get_or_init(|| {
            let digest = Sha256::digest(self.bytes);
            let hex: String = digest[..16]
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header value")
        })
    }

    fn answer(&self, request_headers: &HeaderMap) -> Response {
        let etag = self.etag().clone();
        let fresh = request_headers
            .get(header::IF_NONE_MATCH)
            .is_some_and(|tags| tags.as_bytes() == etag.as_bytes());
        let headers = [
            (header::ETAG, etag),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(self.content_type),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ];
        if fresh {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        (StatusCode::OK, headers, self.bytes).into_response()
    }
}

static PAGE: Asset = Asset::new(
    include_bytes!("../../console/index.html"),
    "text/html; charset=utf-8",
);
static SCRIPT: Asset = Asset::new(
    include_bytes!("../../console/console.js"),
    "text/javascript; charset=utf-8",
);
static STYLE: Asset = Asset::new(
    include_bytes!("../../console/console.css"),
    "text/css; charset=utf-8",
);

/// The console's routes, for every node's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|headers: HeaderMap| async move { PAGE.answer(&headers) }),
        )
        .route(
            "/ui/console.js",
            get(|headers: HeaderMap| async move { SCRIPT.answer(&headers) }),
        )
        .route(
            "/ui/console.css",
            get(|headers: HeaderMap| async move { STYLE.answer(&headers) }),
        )
}
