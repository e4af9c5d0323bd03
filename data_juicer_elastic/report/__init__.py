"""``dj-elastic report``: one self-contained HTML file about a job (running, failed or finished),
drawn from what ``status.job_history`` reads; imports neither Ray, torch nor Data-Juicer."""

__all__ = ["charts", "render", "series", "svg"]
