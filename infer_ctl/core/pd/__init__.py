"""The prefill:decode balance in operation: the controller's decision (control.py), pure."""
