//! The fenced key-value routes (G4): JSON values under paths; a write may carry the fence of a
//! live lease and the session that holds it.

use axum::extract::State;
use axum::http::StatusCode;
use baton_api::{
    self as api, FencedBy, KvDeleteRequest, KvDeleteResponse, KvPutRequest, KvPutResponse,
};
use baton_raft_store::machine::{ResourceFence, SessionId};

use super::error::ApiError;
use super::extract::{read_path, write_path, ApiJson, ApiPath, Ns, Write};
use super::{ApiAnswer, AppState};

fn fence_claim(
    fenced_by: Result<Option<FencedBy<'_>>, String>,
) -> Result<Option<ResourceFence>, ApiError> {
    let Some(fenced_by) = fenced_by.map_err(ApiError::invalid)? else {
        return Ok(None);
    };
    Ok(Some(ResourceFence {
        resource: write_path(&fenced_by.fence.resource)?,
        fence: fenced_by.fence.token,
        session_id: SessionId::parse(fenced_by.session_id.as_str())
            .map_err(ApiError::from_invalid)?,
    }))
}

#[utoipa::path(
    put,
    path = "/v1/kv/{key}",
    tag = "kv",
    summary = "Write a value, unconditionally or fenced",
    params(
        ("key" = String, Path, description = "The key (a path)")
    ),
    request_body = baton_api::KvPutRequest,
    responses(
        (status = 200, description = "Written", body = baton_api::KvPutResponse)
    )
)]
pub async fn put(
    State(app): State<AppState>,
    write: Write,
    ApiPath(path): ApiPath<String>,
    body: ApiJson<KvPutRequest>,
) -> Result<ApiAnswer, ApiError> {
    let key_path = write_path(&path)?;
    let fence = fence_claim(body.value.fenced_by())?;
    let value = serde_json::to_string(&body.value.value).map_err(ApiError::internal)?;
    let size_bytes = value.len() + 128;
    let mutation = write.mutation(&app, &[&path], &body.canonical, size_bytes);
    let written = app.kv_put(mutation, key_path, value, fence).await?;
    Ok(written.answer(
        StatusCode::OK,
        &KvPutResponse {
            revision: written.value,
        },
    ))
}

#[utoipa::path(
    get,
    path = "/v1/kv/{key}",
    tag = "kv",
    summary = "Read a value, its revision and the fence that wrote it",
    params(
        ("key" = String, Path, description = "The key (a path)")
    ),
    responses(
        (status = 200, description = "The entry", body = baton_api::KvEntry)
    )
)]
pub async fn get(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiPath(path): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let key_path = read_path(&app, &path)?;
    let (entry, clocks) = app
        .read(|machine| machine.kv_get(&namespace, &key_path))
        .await?;
    let entry =
        entry.ok_or_else(|| ApiError::not_found(format!("no value is stored under {path}")))?;
    let value = serde_json::from_str(&entry.value).map_err(ApiError::internal)?;
    let answer = api::KvEntry {
        key: entry.key.to_string(),
        value,
        revision: entry.revision,
        fence: entry.fence.map(|(resource, token)| api::FenceRef {
            resource: resource.to_string(),
            token,
        }),
    };
    Ok(ApiAnswer::new(StatusCode::OK, &answer, clocks.cluster_ms))
}

#[utoipa::path(
    delete,
    path = "/v1/kv/{key}",
    tag = "kv",
    summary = "Delete a value, unconditionally or fenced",
    params(
        ("key" = String, Path, description = "The key (a path)")
    ),
    request_body = baton_api::KvDeleteRequest,
    responses(
        (status = 200, description = "Deleted", body = baton_api::KvDeleteResponse)
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    write: Write,
    ApiPath(path): ApiPath<String>,
    body: ApiJson<KvDeleteRequest>,
) -> Result<ApiAnswer, ApiError> {
    let key_path = write_path(&path)?;
    let fence = fence_claim(body.value.fenced_by())?;
    let mutation = write.mutation(&app, &[&path], &body.canonical, 256);
    let deleted = app.kv_delete(mutation, key_path, fence).await?;
    Ok(deleted.answer(
        StatusCode::OK,
        &KvDeleteResponse {
            deleted: true,
            revision: Some(deleted.value),
        },
    ))
}
