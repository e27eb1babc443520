//! The REST API on the unix socket (docs/API.md): the handlers ([`api`]) and the bounded accept
//! loop ([`listener`]). Handlers translate between HTTP and `crate::service::Manager` calls
//! only; nothing here holds state.

pub mod api;
pub mod listener;
