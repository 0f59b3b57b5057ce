from __future__ import annotations

from rest_framework import serializers


class LogQuerySerializer(serializers.Serializer):
    attempt = serializers.IntegerField(
        required=False, min_value=0, help_text="which run (0 first); default the task's current attempt"
    )
    offset = serializers.IntegerField(required=False, min_value=0, default=0, help_text="first line number")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=10_000, default=1_000)
    tail = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000, help_text="the last N lines instead of from offset"
    )
    follow = serializers.BooleanField(
        required=False, default=False, help_text="wait (long poll) until there are lines after offset"
    )
    wait_s = serializers.FloatField(required=False, min_value=0, max_value=30, default=20)

    def validate(self, attrs: dict) -> dict:
        if attrs.get("follow") and attrs.get("tail") is not None:
            why = "tail and follow do not go together; follow from an offset"
            raise serializers.ValidationError({"tail": [why]})
        return attrs


class LogLineSerializer(serializers.Serializer):
    n = serializers.IntegerField(help_text="line number in the run's output (0-based)")
    at = serializers.FloatField(allow_null=True, help_text="when the agent read it, seconds since the epoch")
    stream = serializers.ChoiceField(choices=["stdout", "stderr", "launcher", "dropped"])
    text = serializers.CharField(allow_blank=True)
    partial = serializers.BooleanField(help_text="the process wrote no newline after it")
    dropped_lines = serializers.IntegerField(required=False)
    dropped_bytes = serializers.IntegerField(required=False)


class LogPageSerializer(serializers.Serializer):
    task = serializers.IntegerField(source="task.pk")
    task_state = serializers.CharField(source="task.state")
    exit_code = serializers.IntegerField(source="task.exit_code", allow_null=True)
    task_attempt = serializers.IntegerField(source="task.attempts", help_text="the task's current attempt")
    attempt = serializers.IntegerField(help_text="the attempt these lines are from")
    attempts = serializers.ListField(child=serializers.IntegerField(), help_text="attempts that have output")
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField(help_text="pass as offset to read on")
    complete = serializers.BooleanField(help_text="nothing more will come for this attempt")
    dropped_lines = serializers.IntegerField(help_text="lines of this attempt dropped by the output cap")
    dropped_bytes = serializers.IntegerField()
    lines = LogLineSerializer(many=True)
