"""The training doctor: rules over a run's metric rows that say what is going wrong, why, and the fix.

`jobs.doctor.rulebook.examine` runs the pure rules (`rules`, `resources`, `preference`; thresholds in
docs/runs.md, "The training doctor"); `jobs.doctor.watch.Doctor` runs them inside the worker as rows arrive
and stores each finding once as a run event; `jobs.doctor.findings.findings_of` reads them back (CLI, API).
"""
