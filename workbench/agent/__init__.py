"""The DQN agent: network over one flat parameter buffer, replay, trainer (GPU and CPU reference)."""
