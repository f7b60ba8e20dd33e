-- The Invalidator listens on the channel that reset notifies (placeholder
-- channel).
{{define "invalidator.listen"}}LISTEN {{.channel}}{{end}}
