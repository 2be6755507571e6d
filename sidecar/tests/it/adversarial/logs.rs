//! Hostile MCP servers and tools that log: the server's own log never
//! carries a live secret value, whatever module wrote the line.
