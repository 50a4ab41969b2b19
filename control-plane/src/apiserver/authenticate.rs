//! Bearer token authentication: the chain of token authenticators every
//! request and every TokenReview goes through (static token file,
//! ServiceAccount JWTs, OIDC issuers, bootstrap tokens). Each JWT
//! authenticator takes only the tokens of its own issuers, and the
//! issuers may not overlap, so their order does not decide anything.

use super::ApiServer;
use crate::auth::{self, satoken, Identity};

impl ApiServer {
    /// The identity of a bearer token, and the audiences it was accepted
    /// for. `audiences` None means the API server's own; authenticators
    /// that do not check the API's audiences themselves (static, OIDC and
    /// bootstrap tokens) are valid for the API server's audiences only, as
    /// upstream wraps them.
    ///
    /// # Errors
    /// Why no authenticator accepts the token.
    pub(crate) async fn authenticate_token(
        &self,
        token: &str,
        audiences: Option<&[String]>,
    ) -> Result<(Identity, Vec<String>), String> {
        // Tokens that carry no audience of their own are for the API
        // server's audiences.
        let implicit = || {
            let api: &[String] = self.sa_tokens.get().map_or(&[], |t| t.api_audiences());
            match audiences {
                None => Ok(api.to_vec()),
                Some(wanted) => satoken::common_audiences(api, wanted),
            }
        };
        if let Some(id) = self.authn.authenticate_token(token) {
            return Ok((id, implicit()?));
        }
        if let Some(tokens) = self.sa_tokens.get() {
            let now = jiff::Timestamp::now().as_second();
            if let Some(verdict) = tokens
                .authenticate(self.store.as_ref(), token, audiences, now)
                .await
            {
                return verdict;
            }
        }
        // A JWT naming an OIDC issuer of people is that issuer's alone.
        if let Some(oidc) = self.oidc.get() {
            if let Some(verdict) = oidc.authenticate(token).await {
                return Ok((verdict?, implicit()?));
            }
        }
        match auth::bootstraptoken::authenticate(self.store.as_ref(), token).await {
            Some(id) => Ok((id, implicit()?)),
            None => Err("invalid bearer token".into()),
        }
    }
}
