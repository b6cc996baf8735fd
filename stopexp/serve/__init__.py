"""The OpenAI-compatible server over an engine (`python -m stopexp.serve +exp=NAME`,
docs/serve.md): routes (`app`), request -> paths (`requests`, `run`) -> vote (`vote`), in
one engine loop that every request's paths share (`loop`), answered in OpenAI's schema
(`responses`), with online adaptation from feedback (`feedback`). The stage that builds it
is stopexp.stages.serve; `__main__` is its `python -m` entry point."""
