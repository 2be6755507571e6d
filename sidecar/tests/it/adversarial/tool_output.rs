//! Hostile tools that print secrets in every form the scrubber promises to
//! catch, cut at every point a limit can cut them.
