# Several hosts for real (issue 18): 4 network namespaces on a bridge
# (scripts/test-hosts), Open MPI over TCP between them.  dp2 x tp2 on 2
# hosts and pp2 x dp2 on 4 hosts against one process, host-aware placement,
# a checkpoint across hosts resumed on one, the --ckpt-dir probe, a 2 s link
# flap survived and a longer outage named (labels mpi, faults, hosts).
# Skipped with the reason when not root or network namespaces do not work.
# The two tests share no bed (each its own prefix and subnet) but hold the
# lock "hosts", so that their timing-sensitive faults do not overlap.
ms_script_test(hosts COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hosts/test_hosts.py
  LABELS mpi faults hosts)
set_tests_properties(hosts PROPERTIES TIMEOUT 300 RESOURCE_LOCK hosts)
# The supervisor on a hostfile of 3 such hosts (dp2 + a spare): host 2's
# link goes down for good at step 40; diag finds it silent (run on each host
# alone), it is evicted and the job finishes on the spare, bitwise equal to
# a run without the fault (labels mpi, faults, hosts).
ms_script_test(hosts_supervisor COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hosts/test_hosts_sup.py
  LABELS mpi faults hosts)
set_tests_properties(hosts_supervisor PROPERTIES TIMEOUT 300 RESOURCE_LOCK hosts)
