//! A session-token holder and a second session trying everything the owner
//! and the first session may do.
