"""The methods' server sides, one home each: ``<family>.py``, or a package ``<family>/`` (``strategy.py`` with the
Strategy, the other modules named for what they hold) where the server side needs more than one module. The family
is the declaration module's name (flcore/methods/<family>.py), whose MethodDecl names the Strategy as
``"strategies.methods.<family>[.<module>]:<Class>"``. The infrastructure the strategies share lives one level up
in strategies/."""
