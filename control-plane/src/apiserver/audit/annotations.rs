//! Annotations that code deep inside a request (admission plugins) adds
//! to that request's audit event, as upstream's `audit.AddAuditAnnotation`
//! adds them through the request context.
//!
//! The server runs each request's handler inside [`scoped`] with the
//! request's [`Notes`] (none when the policy does not audit it); the
//! recorder copies them into the event when it writes the response's
//! stages. [`annotate`] outside such a scope, or for an unaudited
//! request, does nothing.

use std::future::Future;
use std::sync::{Arc, Mutex};

tokio::task_local! {
    static NOTES: Option<Notes>;
}

/// One request's added annotations, shared between its handler (which
/// adds) and its recorder (which writes them out).
#[derive(Debug, Clone, Default)]
pub struct Notes(Arc<Mutex<Vec<(String, String)>>>);

impl Notes {
    /// Everything added so far, in order (a later value for a key wins).
    pub fn take(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Run `fut` (a request's handler) with `notes` as the place
/// [`annotate`] writes to.
pub async fn scoped<F: Future>(notes: Option<Notes>, fut: F) -> F::Output {
    NOTES.scope(notes, fut).await
}

/// Add `key: value` to the current request's audit event.
pub fn annotate(key: impl Into<String>, value: String) {
    let _ = NOTES.try_with(|n| {
        if let Some(Ok(mut v)) = n.as_ref().map(|n| n.0.lock()) {
            v.push((key.into(), value));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn annotations_reach_only_their_scope() {
        annotate("outside", "dropped".into());
        let notes = Notes::default();
        scoped(Some(notes.clone()), async {
            annotate("a", "1".into());
        })
        .await;
        scoped(None, async { annotate("b", "2".into()) }).await;
        assert_eq!(notes.take(), vec![("a".to_string(), "1".to_string())]);
        assert!(notes.take().is_empty());
    }
}
