// boot.js — the one classic (non-module) script: it watches the app's modules load and, when
// they do not (a file failed to download: the browser then runs none of them, and the page
// would say "Loading…" for good), says so and loads the page again, waiting 1, 2, 4… s, up to 5
// times a tab. app.js sets window.kloudBooted when it runs, which ends the watch.
(function () {
  'use strict';
  var triesKey = 'kloud.bootTries';
  var given = false;
  function say(text) {
    var main = document.getElementById('main');
    if (!main) return;
    var p = document.createElement('p');
    p.className = 'loading';
    p.textContent = text;
    main.replaceChildren(p);
  }
  function retry(why) {
    if (window.kloudBooted || given) return;
    given = true;
    var tries = Number(sessionStorage.getItem(triesKey) || 0);
    if (tries >= 5) {
      say('Kloud\'s page could not load (' + why + ', ' + tries + ' times). Reload the page to try again.');
      return;
    }
    sessionStorage.setItem(triesKey, String(tries + 1));
    var wait = Math.pow(2, tries);
    say('Kloud\'s page did not load (' + why + '); trying again in ' + wait + ' s…');
    console.warn('kloud: reloading the page: ' + why);
    setTimeout(function () { location.reload(); }, wait * 1000);
  }
  var app = document.getElementById('app-module');
  if (app) app.addEventListener('error', function () { retry('a file failed to download'); });
  // A download that never ends also leaves the page loading: after 45 s without the app, start again.
  setTimeout(function () { retry('no answer within 45 s'); }, 45000);
})();
