"""The data audit: what a job's rows hold besides what the checks refuse (issue 43, part 4).

On the rows a spec trains and evaluates on, read as the checks read them (`reading`, each row's facts once:
`rows`), streamed: each row is tallied as it is read and let go (`scanned`: `copies` for the duplicates,
`tallies` for the rest), so the audit's memory grows by under a kilobyte a row, not with the file: exact and near-duplicate
rows (`near`: MinHash LSH), training rows that are also in the eval data, empty or very short answers, one
answer given to different prompts, chosen identical to rejected, KTO label balance, characters that are not
text, each source's share of a mixture (`content`, `duplicates`). Each finding names its rows, its count and
its fix (`findings`); `dedupe` drops what the duplicate findings name (the spec's `dedupe: true`).

    from jobs.data.audit.report import audit
    found = audit(spec)              # Audit: .findings, .data (the rows' facts), .lengths (characters per training row)

`jobs.checks.duplicates` turns the duplicate findings into the checks' warnings; `tunedeck data audit`
(`app.cli.data_audit`) prints them all.
"""
