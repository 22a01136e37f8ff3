"""Pure rules with no TensorFlow: pipeline schedules (Section 4), WSP clock and pull rules
(Section 5). The runtime, the simulator and the tests' references all use these."""
