"""upf-loadgen: a black-box load generator and delivery-correctness checker for ntfy-protocol push
servers. It shares no code with the server on purpose: it checks the wire, not the implementation."""
