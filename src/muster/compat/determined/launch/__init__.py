"""Determined's launchers; under muster only `torch_distributed`, which runs the script:
muster starts one process per rank itself."""
