"""Policy: which topic a request is about, which profile applies, what to do with a flagged answer,
and the audit trail of every decision. Never talks HTTP; the proxy carries decisions out."""
