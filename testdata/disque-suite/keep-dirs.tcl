# Entry point run.sh gives tclsh instead of the suite's tests/cluster/run.tcl,
# which it then sources unchanged. One thing differs: the suite's cleanup
# (tests/instances.tcl) kills the instances and deletes their directories,
# logs included, at the end of every run, failed or not; here it still kills
# them but leaves the directories, so that run.sh can keep the logs of a
# failed run (and delete them after a passing one).
#
# cleanup is defined while run.tcl sources instances.tcl, before main runs,
# so a trace on proc replaces it as soon as it exists.
proc ::diskque_keep_dirs {cmd code result op} {
    if {[lindex $cmd 1] ne "cleanup" || [info commands ::diskque_cleanup_done] ne {}} return
    proc ::diskque_cleanup_done {} {}
    proc ::cleanup {} {
        puts "Cleaning up (instances killed, directories kept for run.sh)..."
        foreach pid $::pids {
            catch {exec kill -9 $pid}
        }
    }
}
trace add execution proc leave ::diskque_keep_dirs
source tests/cluster/run.tcl
