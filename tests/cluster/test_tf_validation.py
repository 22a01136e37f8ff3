"""Cluster spec checks before anything starts (hetpipe_tf.cluster.tf_validation), also
through `Cluster.from_tf_cluster_spec` and `Cluster.from_tf_config`."""

import json
import re

import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.cluster.tf_validation import (
    load_tf_config,
    split_address,
    validate_jobs,
    validate_task,
)

GOOD = {"chief": {0: "127.0.0.1:2000"}, "worker": {0: "127.0.0.1:2001", 1: "host-b:2001"},
        "ps": {0: "[::1]:2003"}}


def test_good_spec_passes_and_addresses_split():
    validate_jobs(GOOD)
    validate_task(GOOD, "worker", 1)
    assert split_address("127.0.0.1:2000") == ("127.0.0.1", 2000)
    assert split_address("[::1]:2003") == ("::1", 2003)
    assert split_address("node-7.cluster.local:80") == ("node-7.cluster.local", 80)


@pytest.mark.parametrize("jobs, match, received", [
    ({"worker": {0: "127.0.0.1"}}, "has no port", "worker:0='127.0.0.1'"),
    ({"worker": {0: "127.0.0.1:"}}, "has no port", "worker:0='127.0.0.1:'"),
    ({"worker": {0: "127.0.0.1:0"}}, "port of worker:0", "port='0'"),
    ({"worker": {0: "127.0.0.1:70000"}}, "port of worker:0", "port='70000'"),
    ({"worker": {0: "127.0.0.1:22x"}}, "port of worker:0", "port='22x'"),
    ({"worker": {0: "bad host:22"}}, "invalid host name", "host='bad host'"),
    ({"worker": {0: "[::zz]:22"}}, "invalid host name", "host='::zz'"),
    ({"worker": {0: 2222}}, "must be a 'host:port' string", "worker:0=2222"),
    ({"worker": {0: ""}}, "must be a 'host:port' string", "worker:0=''"),
    ({"worker": {0: "a:1", 1: "a:1"}}, "same address", "worker:0 and worker:1 at 'a:1'"),
    ({"worker": {0: "localhost:5"}, "ps": {0: "127.0.0.1:5"}}, "same address",
     "worker:0 and ps:0"),
    ({"wroker": {0: "a:1"}}, "job TensorFlow's strategies do not know", "job='wroker'"),
    ({"chief": {0: "a:1", 1: "a:2"}}, "at most one chief", "chief=['a:1', 'a:2']"),
    ({"worker": {-1: "a:1"}}, "indices of job 'worker'", "index=-1"),
])
def test_bad_specs_name_the_value(jobs, match, received):
    with pytest.raises(ValueError, match=match) as e:
        validate_jobs(jobs)
    message = str(e.value)
    assert "Received: " in message and received in message.split("Received: ", 1)[1]


@pytest.mark.parametrize("job, index, match", [
    ("evaluator", 0, "task type='evaluator'"),
    ("worker", 2, "task index=2, tasks of worker=[0, 1]"),
    ("worker", "0", "task index='0'"),
])
def test_bad_task(job, index, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        validate_task(GOOD, job, index)


def test_cluster_constructors_validate_before_building():
    with pytest.raises(ValueError, match="same address"):
        Cluster.from_tf_cluster_spec({"worker": ["a:1", "a:1"]}, {"worker:0": ["T4"]})
    with pytest.raises(ValueError, match="job='workers'"):
        Cluster.from_tf_cluster_spec({"workers": ["a:1"]}, {})
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "a:2"]},
                                    "task": {"type": "worker", "index": 5}})}
    with pytest.raises(ValueError, match="task index=5"):
        Cluster.from_tf_config(env)
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]},
                                    "task": {"type": "ps", "index": 0}})}
    with pytest.raises(ValueError, match="task type='ps'"):
        Cluster.from_tf_config(env)


@pytest.mark.parametrize("raw, match, received", [
    ('{"cluster": {"worker": [\'a:1\']}}', r"TF_CONFIG is not valid JSON: Expecting value at "
     r"line 1 column 25 \(char 24\)", "TF_CONFIG="),
    ("{not json", r"TF_CONFIG is not valid JSON: Expecting property name enclosed in double "
     r"quotes at line 1 column 2 \(char 1\)", "TF_CONFIG='{not json'"),
    ('{"cluster": {}}\n  x', "line 2 column 3", "TF_CONFIG="),
    ('["worker"]', "TF_CONFIG must be a JSON object", "TF_CONFIG='[\"worker\"]'"),
    ('{"task": ["worker", 0]}', "TF_CONFIG's 'task' entry must be a JSON object",
     "task=['worker', 0]"),
    ('{"cluster": ["a:1"]}', "TF_CONFIG's 'cluster' entry must be a JSON object",
     "cluster=['a:1']"),
    ('{"hetpipe": {"devcies": {}}}', "'hetpipe' section has unknown entries", "hetpipe="),
])
def test_load_tf_config_names_tf_config(raw, match, received):
    with pytest.raises(ValueError, match=match) as e:
        load_tf_config(raw)
    assert not isinstance(e.value, json.JSONDecodeError)   # ours, not json's raw error
    assert "Received: " + received in str(e.value)


def test_long_malformed_tf_config_is_cut_around_the_error():
    raw = json.dumps({"cluster": {"worker": [f"host{i}:2222" for i in range(40)]}})
    cut = raw.index(", ", 300) + 2   # between two addresses
    raw = raw[:cut] + "@" + raw[cut:]
    with pytest.raises(ValueError, match=rf"char {cut}\)") as e:
        load_tf_config(raw)
    assert "..." in str(e.value) and len(str(e.value)) < 500


def test_task_index_as_a_string_is_not_out_of_range():
    with pytest.raises(ValueError, match="task index must be an integer >= 0") as e:
        validate_task(GOOD, "worker", "1")
    assert "out of range" not in str(e.value)
    assert str(e.value).endswith("""Received: task index='1'; write it without quotes: "index": 1.""")
    with pytest.raises(ValueError, match="must be an integer >= 0. Received: task index=1.5"):
        validate_task(GOOD, "worker", 1.5)
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "a:2"]},
                                    "task": {"type": "worker", "index": "1"}})}
    with pytest.raises(ValueError, match="task index must be an integer"):
        Cluster.from_tf_config(env)
