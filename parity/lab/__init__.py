"""The lab: everything a user runs that is not a claim.

    parity/lab/cli/       `python -m parity COMMAND`, one module per command
    parity/lab/runners/   the long runs behind the commands: profile, optimize, miniproject
    parity/lab/report.py  the report: a quick run of the parity tests, printed per claim
    parity/lab/fuzz.py    the fuzz command's pytest run (the fuzz profile, parity/fuzz_plugin.py)
    parity/lab/book/      the book: each topic's twins side by side, as HTML
    parity/lab/your_trainer/  the checks a user points at their own trainer
    parity/lab/gendocs/   every generated part of docs/ (`python -m parity docs`)
    parity/lab/pictures/  every picture in docs/img/ and the report's --out
    parity/lab/ranges.py  the format range table, rendered

The lab sits on top of the proof (parity's claims, drivers, compare, strategies and tests):
it imports them, and nothing below imports the lab (tests/test_layout.py). A new command is
a module in cli/; a new picture a function in pictures/<topic>.py; a new generated doc part a
function in gendocs/<topic>.py. A new claim is not here: it goes in parity/claims/<topic>.py,
with its test in parity/test_<topic>.py.
"""
