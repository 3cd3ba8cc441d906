//! TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1)
//! for a node agent's kubelet API webhooks: the server knows the tokens a test registers with
//! [`ApiServer::add_review_token`], and allows a user a node subresource only when a test said
//! so with [`ApiServer::allow`]. Every access review's spec is kept for the test to read.
//! Both answer 201 with the review and its status, as kube-apiserver does.
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::ApiServer;

/// What the server knows for reviews.
#[derive(Debug, Default)]
pub(super) struct Reviews {
    /// Token -> (user, groups).
    tokens: std::collections::BTreeMap<String, (String, Vec<String>)>,
    /// (user, subresource of nodes) pairs allowed, any verb.
    allowed: Vec<(String, String)>,
    /// The specs of the access reviews asked for.
    access: Vec<serde_json::Value>,
    /// Token reviews asked for.
    token_reviews: usize,
}

impl ApiServer {
    /// Makes `token` a known bearer token of `user` (in `groups`) for TokenReviews.
    pub fn add_review_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.lock().reviews.tokens.insert(
            token.to_owned(),
            (
                user.to_owned(),
                groups.iter().map(|g| (*g).to_owned()).collect(),
            ),
        );
    }

    /// Lets `user` do anything to the `nodes/<subresource>` of any node.
    pub fn allow(&self, user: &str, subresource: &str) {
        self.lock()
            .reviews
            .allowed
            .push((user.to_owned(), subresource.to_owned()));
    }

    /// The spec of every SubjectAccessReview asked for, in order.
    pub fn access_reviews(&self) -> Vec<serde_json::Value> {
        self.lock().reviews.access.clone()
    }

    /// How many TokenReviews were asked for.
    pub fn token_reviews(&self) -> usize {
        self.lock().reviews.token_reviews
    }
}

fn bad_request(what: &str) -> Response {
    (
        axum::http::StatusCode::BAD_REQUEST,
        format!("the body is not a {what}"),
    )
        .into_response()
}

fn created(mut review: serde_json::Value, status: serde_json::Value) -> Response {
    review["status"] = status;
    (axum::http::StatusCode::CREATED, axum::Json(review)).into_response()
}

pub(super) async fn token_review(State(server): State<ApiServer>, body: Bytes) -> Response {
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad_request("TokenReview");
    };
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let mut s = server.lock();
    s.reviews.token_reviews += 1;
    let status = match s.reviews.tokens.get(token) {
        Some((user, groups)) => serde_json::json!({
            "authenticated": true,
            "user": {"username": user, "groups": groups},
        }),
        None => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    created(review, status)
}

pub(super) async fn access_review(State(server): State<ApiServer>, body: Bytes) -> Response {
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad_request("SubjectAccessReview");
    };
    let spec = review["spec"].clone();
    let user = spec["user"].as_str().unwrap_or_default().to_owned();
    let attrs = &spec["resourceAttributes"];
    let subresource = attrs["subresource"].as_str().unwrap_or_default().to_owned();
    let mut s = server.lock();
    let allowed = attrs["resource"] == "nodes"
        && s.reviews
            .allowed
            .iter()
            .any(|(u, sub)| *u == user && *sub == subresource);
    s.reviews.access.push(spec);
    let status = if allowed {
        serde_json::json!({"allowed": true})
    } else {
        serde_json::json!({"allowed": false, "reason": format!("{user} may not use nodes/{subresource}")})
    };
    created(review, status)
}
