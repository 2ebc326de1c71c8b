"""A search env whose retrieval service is down: after the env's `retries` one error naming the service."""

import socket

import pytest

import drmas_envs
from drmas_envs import ServiceError


def test_a_search_against_a_service_that_is_down_raises_one_error_naming_it():
    with socket.socket() as s:  # a loopback port bound but never listening: every connection is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        env = drmas_envs.make("search-2agent", retriever=url, retries=2)
        env.reset(seed=0)
        assert env.agent_selection == "search"
        with pytest.raises(ServiceError) as caught:
            env.step("<search>the capital</search>")
    message = str(caught.value)
    assert caught.value.url == f"{url}/retrieve"
    assert message.startswith(f"retrieval service at {url}/retrieve failed after 3 attempts")
    assert "Connection refused" in message and "\n" not in message


def test_retries_is_a_checked_env_option():
    with pytest.raises(ValueError, match="retries at least 0"):
        drmas_envs.make("search-2agent", retriever="http://127.0.0.1:1", retries=-1)
