//! A second session on the same cached tool: what one session's tool was
//! given must never answer another's call.
