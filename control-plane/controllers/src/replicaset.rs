//! Placeholder: replaced by the controller's implementation.

pub async fn run(_ctx: crate::Ctx) -> Result<(), crate::Error> {
    std::future::pending().await
}
