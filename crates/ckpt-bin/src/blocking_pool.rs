//! The blocking pool, where all disk work runs (ARCHITECTURE.md, The pass): the one
//! runtime thread also answers the health endpoints and times the API probe, so nothing
//! that may wait on a disk runs on it.

use std::sync::Arc;

use ckpt_store::Store;

/// Runs `work` on the store on the blocking pool and waits for it: one fsync on a slow or
/// failing disk can take seconds.
pub(crate) async fn on_disk<T: Send + 'static>(
    store: &Arc<Store>,
    work: impl FnOnce(&Store) -> T + Send + 'static,
) -> T {
    let store = Arc::clone(store);
    blocking(move || work(&store)).await
}

/// Runs `work` (disk work) on the blocking pool and waits for it.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => match e.try_into_panic() {
            // A bug in the store: the panic goes on here.
            Ok(panic) => std::panic::resume_unwind(panic),
            // The runtime is shutting down, which drops this future before it is polled again.
            Err(_) => std::future::pending().await,
        },
    }
}
